"""Test doubles for the planning tests: a dict-backed ToolRunner and plan builders."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from stratagem.planning import CrossAgentStep, Plan, RetryPolicy, ToolContext, ToolRunner, ToolStep

ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.01)


class DictToolRunner(ToolRunner):
    """A ToolRunner over a dict of async functions; records (tool, step, attempt) per call."""

    def __init__(self, tools: dict[str, ToolFn]) -> None:
        self.tools = tools
        self.calls: list[tuple[str, str, int]] = []
        self.contexts: list[ToolContext] = []

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.calls.append((name, ctx.step_id, ctx.attempt))
        self.contexts.append(ctx)
        return await self.tools[name](input, ctx)


async def noop(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"step": ctx.step_id}


async def echo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return dict(input)


class Concurrency:
    """A tool that counts how many of its calls run at once."""

    def __init__(self, hold_s: float = 0.01) -> None:
        self.hold_s = hold_s
        self.current = 0
        self.max = 0
        self.started: list[str] = []
        self.finished: list[str] = []

    async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.current += 1
        self.max = max(self.max, self.current)
        self.started.append(ctx.step_id)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            self.current -= 1
        self.finished.append(ctx.step_id)
        return {"step": ctx.step_id}


def tool_step(step_id: str, *deps: str, tool: str = "noop", **fields: Any) -> ToolStep:
    return ToolStep(id=step_id, tool=tool, depends_on=list(deps), **fields)


def cross_step(
    step_id: str, target: str, capability: str, request: dict[str, Any], *deps: str, **fields: Any
) -> CrossAgentStep:
    return CrossAgentStep(
        id=step_id,
        target=target,
        capability=capability,
        request=request,
        depends_on=list(deps),
        **fields,
    )


def make_plan(*steps: ToolStep | CrossAgentStep, owner: str = "perception", **fields: Any) -> Plan:
    return Plan(id="p1", owner=owner, goal="test the engine", steps=list(steps), **fields)


def rot_artifact(folder: Path, digest: str, rotten: bytes = b"rot!") -> None:
    """Replace the stored bytes of ``digest`` in the artifact folder ``folder`` (a blob file, or
    the bytes the SQLite index keeps with a small artifact's record), as a bad disk would."""
    blob = folder / "blobs" / "sha256" / digest[:2] / digest
    if blob.exists():
        blob.write_bytes(rotten)
        return
    with sqlite3.connect(folder / "index.sqlite3") as conn:
        changed = conn.execute(
            "UPDATE artifact_bytes SET data = ? WHERE digest = ?", (rotten, digest)
        ).rowcount
    assert changed == 1, f"no stored bytes for {digest} in {folder}"
