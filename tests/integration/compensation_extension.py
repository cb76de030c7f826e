"""A test-only extension for the tactical agent: side effects, compensations, failing tools.

Every tool appends whole lines to files named in its input (one ``os.write`` on an ``O_APPEND``
descriptor, so a killed process leaves whole lines or none):

* ``effect_append`` (not idempotent): ``"<plan id> <step id>"`` to ``ledger`` per execution;
* ``undo_append`` (idempotent, a compensating tool): ``"<plan id> <step id>"`` to ``calls`` per
  execution, and to ``ledger`` only when the compensated step's ``call_id`` is not there yet: the
  effect is deduplicated on the call id, as ``docs/durability.md`` asks of compensating tools;
* ``refuse``: always fails with a ``policy`` failure (a plan that fails at a chosen step);
* ``always_unavailable``: counts its call in ``calls``, then fails with a ``transient`` failure
  (trips a circuit breaker).

Actors load it through ``STRATAGEM_EXTENSIONS=tests.integration.compensation_extension``, with the
repository's folder in ``STRATAGEM_EXTENSION_PATHS``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from stratagem.agents import Agent, tool
from stratagem.planning import PolicyError, ToolContext, TransientError


class Line(BaseModel):
    """The line a tool wrote (or would have written)."""

    line: str


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _read_lines(path: str) -> list[str]:
    file = Path(path)
    return file.read_text().splitlines() if file.exists() else []


@tool(name="effect_append", idempotent=False)
async def effect_append(ledger: str, ctx: ToolContext, pause_s: float = 0.0) -> Line:
    """Wait ``pause_s``, then append ``"<plan id> <step id>"`` to the ledger (not idempotent)."""
    await asyncio.sleep(pause_s)
    line = f"{ctx.plan_id} {ctx.step_id}"
    _append(ledger, line)
    return Line(line=line)


@tool(name="undo_append", idempotent=True)
async def undo_append(ledger: str, calls: str, ctx: ToolContext, pause_s: float = 0.0) -> Line:
    """Undo ``effect_append``: count the call in ``calls``, write the ledger once per call id."""
    line = f"{ctx.plan_id} {ctx.step_id}"
    _append(calls, line)
    await asyncio.sleep(pause_s)
    marker = f"{line} {ctx.call_id}"
    if marker not in _read_lines(ledger):
        _append(ledger, marker)
    return Line(line=marker)


@tool(name="refuse", idempotent=True)
async def refuse(reason: str, ctx: ToolContext) -> Line:
    """Always fail with a ``policy`` failure."""
    raise PolicyError(f"refused: {reason}")


@tool(name="always_unavailable", idempotent=True)
async def always_unavailable(calls: str, ctx: ToolContext) -> Line:
    """Append ``"<plan id> <step id>"`` to ``calls``, then fail with a ``transient`` failure."""
    _append(calls, f"{ctx.plan_id} {ctx.step_id}")
    raise TransientError("the backend is unavailable")


def setup(agent: Agent) -> None:
    """Give the tactical agent the four tools."""
    if agent.role != "tactical":
        return
    for found in (effect_append, undo_append, refuse, always_unavailable):
        agent.registry.register(found)
