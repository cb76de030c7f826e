"""The agent's parts on their own: ``PlanRuns`` (the runs in flight, their one owner) and a
``PlanControl`` built from a ``ControlDeps`` with no ``Agent`` around it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import PlanRecord, ToolRegistry
from stratagem.agents._control import ControlDeps, PlanControl
from stratagem.agents._records import PlanBook
from stratagem.agents._runs import PlanRuns
from stratagem.planning import (
    Engine,
    GateStep,
    Plan,
    PlanResult,
    PlanStatus,
    SqliteStateStore,
    StepEvent,
)
from stratagem.protocol import PermissionDeniedError, Policy


def _result(plan_id: str) -> PlanResult[Any]:
    plan = Plan(id=plan_id, owner="perception", goal="nothing")
    return PlanResult(
        status=PlanStatus.SUCCEEDED,
        outputs={},
        failures=[],
        statuses={},
        events=0,
        duration_s=0.0,
        submitted=plan,
    )


async def test_a_background_task_is_joined_waited_for_and_forgotten_when_it_ends() -> None:
    runs = PlanRuns("perception")
    go = asyncio.Event()
    made: list[str] = []

    async def resuming(started: asyncio.Event) -> PlanResult[Any]:
        await asyncio.sleep(0)
        started.set()
        await go.wait()
        return _result("p")

    def starting(started: asyncio.Event) -> Coroutine[Any, Any, PlanResult[Any]]:
        made.append("p")
        return resuming(started)

    task = runs.background("p", starting, name="resume p")
    # A second start while it runs joins it: one task a plan, its coroutine made once.
    assert runs.background("p", starting, name="resume p") is task
    assert made == ["p"]
    assert runs.task("p") is task
    assert (runs.is_active("p"), runs.is_serving("p")) == (True, False)
    await runs.ready("p")  # returns once the run is live
    assert not task.done()
    go.set()
    assert (await task).status is PlanStatus.SUCCEEDED
    await asyncio.sleep(0)
    assert runs.task("p") is None
    assert not runs.is_active("p")
    await runs.ready("p")  # nothing to wait for any more


async def test_a_failed_background_task_is_logged_and_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = PlanRuns("perception")

    async def failing(started: asyncio.Event) -> PlanResult[Any]:
        raise RuntimeError("the store is gone")

    with caplog.at_level(logging.ERROR, logger="stratagem.agents._runs"):
        task = runs.background("p", failing, name="resume p", live=True)
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert "agent perception: resuming resume p failed: the store is gone" in caplog.text
    assert not runs.is_active("p")


async def test_serving_marks_a_plan_for_its_block_even_when_it_fails() -> None:
    runs = PlanRuns("perception")
    seen: list[tuple[bool, bool]] = []

    def failing() -> None:
        with runs.serving("p"):
            seen.append((runs.is_serving("p"), runs.is_active("p")))
            raise RuntimeError("the run failed")

    with pytest.raises(RuntimeError):
        failing()
    assert seen == [(True, True)]
    assert (runs.is_serving("p"), runs.is_active("p")) == (False, False)


async def test_aclose_closes_and_interrupts_unbound_runs_then_background_tasks() -> None:
    runs = PlanRuns("perception")
    order: list[str] = []

    async def waits(name: str) -> PlanResult[Any]:
        try:
            await asyncio.Event().wait()
        finally:
            order.append(f"{name} interrupted, closing={runs.closing}")
        raise AssertionError("unreachable")

    unbound = runs.unbound(waits("run"), "a")
    background = runs.background("b", lambda started: waits("resume"), name="resume b")
    await asyncio.sleep(0)
    assert not runs.closing
    await runs.aclose()
    assert runs.closing
    assert (unbound.cancelled(), background.cancelled()) == (True, True)
    assert order == ["run interrupted, closing=True", "resume interrupted, closing=True"]
    assert (runs.is_active("a"), runs.is_active("b")) == (False, False)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStateStore]:
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as opened:
        yield opened


POLICY = """
[[allow]]
caller = "operator"
target = "*"
capabilities = ["*"]

[roles]
leads = ["ana"]

[[gate]]
agent = "perception"
deciders = ["role:leads"]
"""


async def test_plan_control_needs_no_agent_and_asks_its_policy_at_each_decision(
    store: SqliteStateStore,
) -> None:
    registry = ToolRegistry("perception")
    engine = Engine(tools=registry, agent="perception", store=store)
    book, runs = PlanBook("perception", 10), PlanRuns("perception")
    policy: list[Policy | None] = [Policy.from_toml(POLICY)]
    control = PlanControl(
        ControlDeps(
            role="perception",
            plan_type=Plan,
            engine=engine,
            store=store,
            book=book,
            runs=runs,
            problems=lambda plan: [],
            policy=lambda: policy[0],
            planner_of=lambda capability: None,
        )
    )
    plan = Plan(
        id="g",
        owner="perception",
        goal="wait for a decision",
        steps=[GateStep(id="ok", prompt="Go?")],
    )
    record = book.remember(PlanRecord(plan=plan))
    blocked = asyncio.Event()

    def observe(event: StepEvent) -> None:
        book.observe(record, event)
        if not event.step_id and event.status is PlanStatus.BLOCKED:
            blocked.set()

    with runs.serving("g"):
        run = asyncio.create_task(engine.run(plan, on_event=observe))
        await blocked.wait()
        with pytest.raises(PermissionDeniedError, match="'bo' may not decide gate 'ok'"):
            await control.decide_gate("g", "ok", approve=True, approver="bo", rationale="")
        policy[0] = None  # the agent's policy changed: anyone may decide now
        await control.decide_gate("g", "ok", approve=True, approver="bo", rationale="")
        assert (await run).status is PlanStatus.SUCCEEDED
    assert control.role == "perception"
    revisions = await control.revisions("g")
    assert [entry.revision for entry in revisions.revisions] == [1]
