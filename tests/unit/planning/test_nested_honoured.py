"""A loop's and a sub-plan's own ``timeout_s`` and ``retry``: honoured, durably.

``timeout_s`` is a timebox over the whole step (the running nested plan is cancelled and
compensates itself; the step fails ``timeout``); a sub-plan's ``retry`` runs the whole nested plan
again, and a loop's its failed iteration, each attempt a new nested plan started once the failed
one has compensated itself. Both hold across a restart (issue 32).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    Engine,
    FailureClass,
    InMemoryStateStore,
    Plan,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    TransientError,
    replay,
)

from ._support import DictToolRunner, noop

FAST = {"max_attempts": 3, "initial_backoff_s": 0.001, "max_backoff_s": 0.01}
BOUND_S = 10.0  # generous: a step that is not timeboxed hangs past it


def plan_of(*steps: dict[str, Any]) -> Plan:
    return Plan(id="p", owner="tactical", goal="test nested steps", steps=list(steps))


class Effects:
    """Tools that record what they did, by nested plan: ``x`` (undone by ``undo``), ``stuck``
    (never returns), ``flaky`` (fails transiently until ``fail_first`` calls have failed)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.log: list[str] = []
        self.fail_first = fail_first
        self.flaky_calls = 0
        self.stuck_started = asyncio.Event()

    def runner(self) -> DictToolRunner:
        return DictToolRunner(
            {"noop": noop, "x": self.x, "undo": self.undo, "stuck": self.stuck, "flaky": self.flaky}
        )

    async def x(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.log.append(f"do {ctx.plan_id}")
        return {"done": True}

    async def undo(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.log.append(f"undo {ctx.plan_id}")
        return {}

    async def stuck(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.stuck_started.set()
        await asyncio.Event().wait()
        return {}

    async def flaky(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.flaky_calls += 1
        if self.flaky_calls <= self.fail_first:
            raise TransientError(f"not yet ({self.flaky_calls})")
        return {"ok": True}


def body(last: str) -> list[dict[str, Any]]:
    """A body: ``a`` (an effect, compensated) then ``last`` (a tool: stuck, flaky...)."""
    return [
        {"kind": "tool", "id": "a", "tool": "x", "compensate": "undo"},
        {
            "kind": "tool",
            "id": "b",
            "tool": last,
            "depends_on": ["a"],
            "retry": {"max_attempts": 1},
        },
    ]


# --- timeout_s: a timebox over the whole step --------------------------------------------------


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("kind", ["subplan", "loop"])
async def test_a_nested_steps_timeout_fails_it_and_undoes_its_running_plan(
    kind: str, durable: bool
) -> None:
    effects = Effects()
    step: dict[str, Any] = {"kind": kind, "id": "s", "timeout_s": 0.1, "steps": body("stuck")}
    if kind == "loop":
        step["max_iterations"] = 3
    store = InMemoryStateStore() if durable else None
    engine = Engine(tools=effects.runner(), agent="tactical", store=store)
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.failure_class is FailureClass.TIMEOUT
    assert failure.message.startswith("it timed out after 0.1s (timeout_s)")
    nested = "p/s" if kind == "subplan" else "p/s.1"
    assert effects.log == [f"do {nested}", f"undo {nested}"]  # undone once, not twice
    if store is not None:
        state = await store.load(nested)
        assert state is not None
        assert state.status is PlanStatus.CANCELLED


async def test_a_timeout_covers_a_loops_iterations_not_each_one() -> None:
    """Each iteration is quick; together they pass the timebox (without one: 1000 iterations)."""
    now = [1000.0]

    async def tick(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        now[0] += 4.0  # each iteration takes four seconds of the (fake) clock
        await asyncio.sleep(0.01)  # and a little real time, so the real timebox fires too
        return {}

    step = {
        "kind": "loop",
        "id": "l",
        "max_iterations": 1000,
        "timeout_s": 0.05,
        "steps": [{"kind": "tool", "id": "t", "tool": "tick"}],
    }
    engine = Engine(tools=DictToolRunner({"tick": tick}), agent="tactical", clock=lambda: now[0])
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].failure_class is FailureClass.TIMEOUT


async def test_a_timebox_holds_across_a_restart(tmp_path: Path) -> None:
    """The timebox counts from the step's journaled first start: a run resumed after it expired
    fails the step at once (and undoes the nested plan) instead of running it again."""
    now = [1000.0]
    path = tmp_path / "state.db"
    effects = Effects()
    step = {"kind": "subplan", "id": "s", "timeout_s": 5.0, "steps": body("stuck")}
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=effects.runner(), agent="tactical", store=store, clock=lambda: now[0])
        running = asyncio.create_task(engine.run(plan_of(step)))
        await asyncio.wait_for(effects.stuck_started.wait(), BOUND_S)
        running.cancel()  # the agent stops: the plan stays running in the store
        with pytest.raises(asyncio.CancelledError):
            await running
    now[0] += 60.0  # down for a minute: the timebox expired meanwhile
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=effects.runner(), agent="tactical", store=store, clock=lambda: now[0])
        result = await asyncio.wait_for(engine.resume("p"), BOUND_S)
        assert result.status is PlanStatus.FAILED
        assert result.failures[0].failure_class is FailureClass.TIMEOUT
        assert effects.log == ["do p/s", "undo p/s"]
        state = await store.load("p/s")
        assert state is not None
        assert state.status is PlanStatus.CANCELLED


# --- retry: the whole sub-plan again ----------------------------------------------------------


async def test_a_subplans_retry_runs_it_again_after_undoing_the_failed_attempt() -> None:
    effects = Effects(fail_first=2)
    store = InMemoryStateStore()
    step = {"kind": "subplan", "id": "s", "retry": FAST, "steps": body("flaky")}
    engine = Engine(tools=effects.runner(), agent="tactical", store=store)
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    state = await store.load("p")
    assert state is not None
    assert state.steps["s"].attempt == 3
    # Each attempt a nested plan of its own; a failed one undid its effect before the next began.
    assert effects.log == [
        "do p/s",
        "undo p/s",
        "do p/s.a2",
        "undo p/s.a2",
        "do p/s.a3",
    ]
    assert result.outputs["s"]["b"] == {"ok": True}


async def test_a_retried_subplan_replays_each_attempt_from_its_own_nested_plan() -> None:
    effects = Effects(fail_first=1)
    store = InMemoryStateStore()
    flaky = {"kind": "tool", "id": "b", "tool": "flaky", "retry": {"max_attempts": 1}}
    step = {"kind": "subplan", "id": "s", "retry": FAST, "steps": [flaky]}
    engine = Engine(tools=effects.runner(), agent="tactical", store=store)
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    replayed = await replay(store, "p", timeout_s=BOUND_S)
    assert not replayed.diverged, replayed.divergences


async def test_a_subplan_without_retry_makes_one_attempt() -> None:
    effects = Effects(fail_first=1)
    step = {"kind": "subplan", "id": "s", "steps": body("flaky")}
    result = await Engine(tools=effects.runner(), agent="tactical").run(plan_of(step))
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].failure_class is FailureClass.TRANSIENT
    assert effects.log == ["do p/s", "undo p/s"]


async def test_a_subplans_retry_resumes_the_attempt_that_was_running(tmp_path: Path) -> None:
    """A restart mid-way through attempt 2 resumes attempt 2: attempt 1 (failed, undone) is not
    run again, and attempt 2's done effect is not redone."""
    path = tmp_path / "state.db"
    effects = Effects(fail_first=1)
    calls = {"n": 0}

    async def second(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls["n"] += 1
        if ctx.plan_id == "p/s":
            raise TransientError("first attempt fails")
        await effects.stuck(input, ctx)
        return {}

    class Runner(DictToolRunner):
        def is_idempotent(self, name: str) -> bool:
            return name == "second"  # in flight at the restart: simply run again

    runner = Runner(effects.runner().tools)
    runner.tools["second"] = second
    step = {"kind": "subplan", "id": "s", "retry": FAST, "steps": body("second")}
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        running = asyncio.create_task(engine.run(plan_of(step)))
        await asyncio.wait_for(effects.stuck_started.wait(), BOUND_S)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert effects.log == ["do p/s", "undo p/s", "do p/s.a2"]

    async def done(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"ok": ctx.plan_id}

    runner.tools["second"] = done
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        result = await asyncio.wait_for(engine.resume("p"), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["s"]["b"] == {"ok": "p/s.a2"}
    assert effects.log == ["do p/s", "undo p/s", "do p/s.a2"]  # nothing redone


async def test_a_loops_retry_runs_a_failed_iteration_again_after_undoing_it() -> None:
    effects = Effects(fail_first=1)
    seen: list[tuple[str, int]] = []

    async def flaky(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        seen.append((ctx.plan_id, input["n"]))
        return await effects.flaky(input, ctx)

    runner = effects.runner()
    runner.tools["flaky"] = flaky
    [a, b] = body("flaky")
    b["input"] = {"n": {"$expr": "inputs.iteration"}}
    step = {"kind": "loop", "id": "l", "max_iterations": 2, "retry": FAST, "steps": [a, b]}
    store = InMemoryStateStore()
    engine = Engine(tools=runner, agent="tactical", store=store)
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["l"]["iterations"] == 2
    # Iteration 1 again (the same inputs.iteration) as a nested plan of its own, once the
    # failed attempt had undone its effect; iteration 2 after it.
    assert effects.log == ["do p/l.1", "undo p/l.1", "do p/l.1.a2", "do p/l.2"]
    assert seen == [("p/l.1", 1), ("p/l.1.a2", 1), ("p/l.2", 2)]


async def test_a_loops_iteration_retries_at_most_max_attempts_each() -> None:
    effects = Effects(fail_first=5)
    step = {"kind": "loop", "id": "l", "max_iterations": 3, "retry": FAST, "steps": body("flaky")}
    result = await Engine(tools=effects.runner(), agent="tactical").run(plan_of(step))
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.failure_class is FailureClass.TRANSIENT
    assert failure.attempts == 3
    assert failure.message.startswith("iteration 1 (p/l.1.a3) failed")


async def test_a_retried_loop_replays_each_attempt_from_its_own_nested_plan() -> None:
    effects = Effects(fail_first=1)
    store = InMemoryStateStore()
    flaky = {"kind": "tool", "id": "b", "tool": "flaky", "retry": {"max_attempts": 1}}
    step = {"kind": "loop", "id": "l", "max_iterations": 2, "retry": FAST, "steps": [flaky]}
    engine = Engine(tools=effects.runner(), agent="tactical", store=store)
    result = await asyncio.wait_for(engine.run(plan_of(step)), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    replayed = await replay(store, "p", timeout_s=BOUND_S)
    assert not replayed.diverged, replayed.divergences


async def test_a_loops_retry_resumes_the_attempt_that_was_running(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    effects = Effects()

    async def second(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if ctx.plan_id == "p/l.1":
            raise TransientError("first attempt fails")
        await effects.stuck(input, ctx)
        return {}

    class Runner(DictToolRunner):
        def is_idempotent(self, name: str) -> bool:
            return name == "second"

    runner = Runner(effects.runner().tools)
    runner.tools["second"] = second
    step = {"kind": "loop", "id": "l", "max_iterations": 1, "retry": FAST, "steps": body("second")}
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        running = asyncio.create_task(engine.run(plan_of(step)))
        await asyncio.wait_for(effects.stuck_started.wait(), BOUND_S)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert effects.log == ["do p/l.1", "undo p/l.1", "do p/l.1.a2"]

    async def done(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"ok": ctx.plan_id}

    runner.tools["second"] = done
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        result = await asyncio.wait_for(engine.resume("p"), BOUND_S)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["l"]["last"]["b"] == {"ok": "p/l.1.a2"}
    assert effects.log == ["do p/l.1", "undo p/l.1", "do p/l.1.a2"]  # nothing redone
