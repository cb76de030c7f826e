"""The claim check: a tool output above the stated size is journaled as an artifact reference;
the run reads it whole, a resumed plan loads it back (real SQLite stores and blob files)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from stratagem.planning import (
    ArtifactRef,
    ArtifactStore,
    ClaimCheck,
    Engine,
    GateStep,
    Plan,
    PlanStatus,
    SqliteStateStore,
    StepEvent,
    StepResult,
    StepStatus,
    ToolContext,
    ToolStep,
    ref,
)

from ._support import DictToolRunner, echo

BIG = "x" * 5000


async def big(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"content": BIG, "step": ctx.step_id}


def _plan(*, gated: bool) -> Plan:
    gate = [GateStep(id="ok", prompt="go on?", depends_on=["make", "small"])] if gated else []
    return Plan(
        id="claim",
        owner="tactical",
        goal="g",
        steps=[
            ToolStep(id="make", tool="big"),
            ToolStep(id="small", tool="echo", input={"n": 1}),
            *gate,
            ToolStep(
                id="use",
                tool="echo",
                input={"got": ref("make.content")},
                depends_on=["ok"] if gated else ["make", "small"],
            ),
        ],
    )


def _engine(store: SqliteStateStore, artifacts: ArtifactStore) -> Engine:
    return Engine(
        tools=DictToolRunner({"big": big, "echo": echo}),
        agent="tactical",
        store=store,
        claim_check=ClaimCheck(artifacts, max_inline_bytes=1000),
    )


async def _run_to_the_gate(engine: Engine) -> None:
    """Run the gated plan until it waits at its gate, then interrupt it (as a stopped process
    would)."""
    at_gate = asyncio.Event()

    def seen(event: StepEvent) -> None:
        if event.step_id == "ok" and event.status is StepStatus.BLOCKED:
            at_gate.set()

    task = asyncio.create_task(engine.run(_plan(gated=True), on_event=seen))
    await asyncio.wait_for(at_gate.wait(), 60)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _journaled(store: SqliteStateStore, step_id: str) -> Any:
    [result] = [
        r
        for r in await store.journal("claim", 1)
        if isinstance(r, StepResult) and r.step_id == step_id
    ]
    return json.loads(result.output_json or "null")


async def test_a_large_output_is_journaled_by_reference_and_read_whole(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "plans.sqlite3")
    artifacts = ArtifactStore.open(tmp_path / "artifacts")
    result = await _engine(store, artifacts).run(_plan(gated=False))
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["make"]["content"] == BIG  # the run keeps it whole
    assert result.outputs["use"] == {"got": BIG}
    journaled = await _journaled(store, "make")
    made = ArtifactRef.from_json(journaled)
    assert made is not None, journaled
    assert (made.name, made.version, made.scope, made.scope_id) == (
        "make.output.json",
        1,
        "plan",
        "claim",
    )
    assert made.size > 5000
    record, data = await artifacts.load("make.output.json", scope="plan", scope_id="claim")
    assert json.loads(data) == {"content": BIG, "step": "make"}
    assert record.provenance.step_id == "make"
    assert await _journaled(store, "small") == {"n": 1}  # small outputs stay inline
    await store.aclose()


async def test_a_resumed_plan_reads_the_output_back_from_the_artifact(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "plans.sqlite3")
    artifacts = ArtifactStore.open(tmp_path / "artifacts")
    await _run_to_the_gate(_engine(store, artifacts))
    await store.aclose()
    # another process: a fresh engine on the same files
    store = SqliteStateStore(tmp_path / "plans.sqlite3")
    engine = _engine(store, ArtifactStore.open(tmp_path / "artifacts"))
    await engine.decide(
        "claim", "ok", approve=True, approver="operator", rationale="go", revision=1
    )
    result = await engine.resume("claim")
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["use"] == {"got": BIG}
    # the resumed run's own large output went out by reference too; make's was not saved again
    saved = await artifacts.list(scope="plan", scope_id="claim", latest=False)
    assert [(r.name, r.version) for r in saved] == [("make.output.json", 1), ("use.output.json", 1)]
    await store.aclose()
