"""Revisions: diffs, carry-over of unchanged results, history, replanning on logic failures,
policy failures that abort or gate."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    Engine,
    EngineConfig,
    FailureClass,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanControlError,
    PlanStatus,
    PolicyError,
    SqliteStateStore,
    StepChange,
    StepEvent,
    StepFailure,
    StepStatus,
    ToolContext,
    ToolStep,
    diff_plans,
    ref,
    replay,
    unchanged_steps,
)

from ._support import DictToolRunner


class Counting:
    """A tool that counts its runs per step and fails where told to."""

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.runs: Counter[str] = Counter()
        self.fail = fail or {}

    async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.runs[ctx.step_id] += 1
        error = self.fail.pop(ctx.step_id, None)
        if error is not None:
            raise error
        return {"step": ctx.step_id, "input": input}


def step(step_id: str, *deps: str, **fields: Any) -> ToolStep:
    return ToolStep(id=step_id, tool="count", depends_on=list(deps), **fields)


def plan(*steps: ToolStep, revision: int = 1) -> Plan:
    return Plan(id="r1", revision=revision, owner="tactical", goal="revise", steps=list(steps))


def test_diff_lists_added_removed_and_changed_steps_with_fields() -> None:
    old = plan(step("a"), step("b", "a"), step("c", "b"), step("gone", "a"))
    new = plan(
        step("a", title="renamed"),
        step("b", "a", input={"x": 1}),
        step("c", "b"),
        step("d", "c"),
    )
    diff = diff_plans(old, new)
    assert diff.added == ["d"]
    assert diff.removed == ["gone"]
    assert diff.changed == [StepChange("a", ["title"]), StepChange("b", ["input"])]


def test_unchanged_needs_equal_definition_and_unchanged_dependencies() -> None:
    old = plan(step("a"), step("b", "a"), step("c", "b"), step("e"))
    new = plan(step("a", title="only the title"), step("b", "a", input={"x": 1}), step("c", "b"))
    new = new.model_copy(update={"steps": [*new.steps, step("e", timeout_s=5.0)]})
    # a: title is not part of the definition; b: input changed; c: its dependency changed.
    assert unchanged_steps(old, new) == {"a", "e"}


async def test_replan_carries_unchanged_results_and_keeps_history(tmp_path: Path) -> None:
    tool = Counting(fail={"c": LogicError("c needs another input")})
    runner = DictToolRunner({"count": tool})
    path = tmp_path / "state.db"
    first = plan(step("a"), step("b", "a"), step("c", "b", input={"v": ref("b.step")}))
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        result = await engine.run(first)
        assert result.status is PlanStatus.FAILED
        journal_before = await store.journal("r1", 1)
        fixed = plan(
            step("a"),
            step("b", "a"),
            step("c", "b", input={"v": ref("b.step"), "fixed": True}),
            step("d", "c"),
        )
        revision = await engine.replan(
            "r1", fixed, rationale="c needs the fixed flag", author="operator:ana"
        )
        assert revision.revision == 2
        assert revision.record.parent == 1
        assert revision.record.carried == ["a", "b"]
        assert revision.diff.added == ["d"]
        assert revision.diff.changed == [StepChange("c", ["input"])]
    # A fresh engine and store on the same file: the new revision resumes, a and b do not rerun.
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        assert await store.unfinished() == ["r1"]
        result = await engine.resume("r1")
        assert result.status is PlanStatus.SUCCEEDED
        assert result.submitted.revision == 2
        assert tool.runs == Counter({"a": 1, "b": 1, "c": 2, "d": 1})
        assert result.outputs["c"]["input"] == {"v": "b", "fixed": True}
        history = await store.revisions("r1")
        assert [(r.revision, r.parent) for r in history] == [(1, None), (2, 1)]
        assert (history[1].rationale, history[1].author) == (
            "c needs the fixed flag",
            "operator:ana",
        )
        assert history[1].diff.added == ["d"]
        # The old revision is never touched again.
        assert await store.journal("r1", 1) == journal_before
        assert await store.unfinished() == []


async def test_replan_refuses_an_engine_without_store_and_a_step_in_flight() -> None:
    engine = Engine(tools=DictToolRunner({"count": Counting()}), agent="tactical")
    with pytest.raises(PlanControlError, match="no state store"):
        await engine.replan("r1", plan(step("a")), rationale="x", author="y")
    store = InMemoryStateStore()
    hold = asyncio.Event()

    async def stuck(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await hold.wait()
        return {}

    engine = Engine(tools=DictToolRunner({"count": stuck}), agent="tactical", store=store)
    task = asyncio.create_task(engine.run(plan(step("a"))))
    for _ in range(20):
        await asyncio.sleep(0)
    with pytest.raises(PlanControlError, match="is running; pause it"):
        await engine.replan("r1", plan(step("b")), rationale="x", author="y")
    task.cancel()  # a crash with 'a' in flight
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(PlanControlError, match="step 'a' of plan 'r1' was in flight"):
        await engine.replan("r1", plan(step("b")), rationale="x", author="y")
    assert [r.revision for r in await store.revisions("r1")] == [1]


class FixingReplanner:
    """Replaces the failed step's input with a fixed one; records what it was asked."""

    def __init__(self, fix: bool = True) -> None:
        self.calls: list[tuple[int, StepFailure]] = []
        self.fix = fix

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        self.calls.append((plan.revision, failure))
        steps = [
            s.model_copy(update={"input": {"fixed": True}})
            if self.fix and s.id == failure.step_id and isinstance(s, ToolStep)
            else s
            for s in plan.steps
        ]
        return plan.model_copy(update={"steps": steps})


async def test_a_logic_failure_makes_a_new_revision_and_the_run_continues() -> None:
    tool = Counting(fail={"b": LogicError("b got a bad input")})
    store = InMemoryStateStore()
    replanner = FixingReplanner()
    events: list[StepEvent] = []
    engine = Engine(
        tools=DictToolRunner({"count": tool}), agent="tactical", store=store, replanner=replanner
    )
    result = await engine.run(
        plan(step("a"), step("b", "a"), step("c", "b")), on_event=events.append
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert result.submitted.revision == 2
    assert [(rev, f.step_id, f.failure_class) for rev, f in replanner.calls] == [
        (1, "b", FailureClass.LOGIC)
    ]
    assert tool.runs == Counter({"a": 1, "b": 2, "c": 1})  # a carried over
    assert result.outputs["b"]["input"] == {"fixed": True}
    history = await store.revisions("r1")
    assert [(r.revision, r.parent, r.author) for r in history][1] == (2, 1, "replanner:tactical")
    assert history[1].rationale == "step 'b' failed (logic): b got a bad input"
    assert history[1].carried == ["a"]
    final = [e for e in events if e.step_id == "" and e.status is PlanStatus.SUCCEEDED]
    assert [e.revision for e in final] == [2]
    # Revision 1's journal ends without a final status; only the newest revision counts.
    state = await store.load("r1")
    assert state is not None
    assert (state.revision, state.status) == (2, PlanStatus.SUCCEEDED)
    assert await store.unfinished() == []


async def test_a_replanned_run_on_sqlite_replays_without_divergence(tmp_path: Path) -> None:
    tool = Counting(fail={"b": LogicError("b got a bad input")})
    async with SqliteStateStore(tmp_path / "state.db") as store:
        engine = Engine(
            tools=DictToolRunner({"count": tool}),
            agent="tactical",
            store=store,
            replanner=FixingReplanner(),
        )
        result = await engine.run(plan(step("a"), step("b", "a"), step("c", "b")))
        assert result.status is PlanStatus.SUCCEEDED
        assert await store.unfinished() == []
        runs = Counter(tool.runs)
        report = await replay(store, "r1")
        assert report.revision == 2
        assert report.divergences == []
        assert tool.runs == runs


async def test_replans_stop_at_max_replans() -> None:
    replanner = FixingReplanner(fix=False)

    class AlwaysFailing(Counting):
        async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            self.runs[ctx.step_id] += 1
            if ctx.step_id == "b":
                raise LogicError("always")
            return {}

    tool = AlwaysFailing()
    engine = Engine(
        EngineConfig(max_replans=2),
        tools=DictToolRunner({"count": tool}),
        agent="tactical",
        replanner=replanner,
    )
    result = await engine.run(plan(step("a"), step("b", "a")))
    assert result.status is PlanStatus.FAILED
    assert [rev for rev, _ in replanner.calls] == [1, 2]
    assert result.submitted.revision == 3
    assert tool.runs == Counter({"a": 1, "b": 3})


async def test_a_policy_failure_aborts_without_replanning() -> None:
    tool = Counting(fail={"b": PolicyError("not allowed")})
    replanner = FixingReplanner()
    engine = Engine(tools=DictToolRunner({"count": tool}), agent="tactical", replanner=replanner)
    result = await engine.run(plan(step("a"), step("b", "a"), step("c", "b")))
    assert result.status is PlanStatus.FAILED
    assert result.failures == [StepFailure("b", FailureClass.POLICY, "not allowed", 1)]
    assert replanner.calls == []
    assert result.statuses["c"] is StepStatus.SKIPPED


@pytest.mark.parametrize("approve", [True, False])
async def test_a_policy_failure_can_hold_the_plan_at_a_gate(approve: bool) -> None:
    tool = Counting(fail={"b": PolicyError("needs a second signature")})
    store = InMemoryStateStore()
    engine = Engine(tools=DictToolRunner({"count": tool}), agent="tactical", store=store)
    blocked: list[StepEvent] = []

    def on_event(event: StepEvent) -> None:
        if event.status is StepStatus.BLOCKED:
            blocked.append(event)
            asyncio.get_running_loop().create_task(
                engine.decide(
                    "r1", "b", approve=approve, approver="ana", rationale="signed", revision=1
                )
            )

    p = plan(step("a"), step("b", "a", on_policy_failure="gate"), step("c", "b"))
    result = await engine.run(p, on_event=on_event)
    assert [e.step_id for e in blocked] == ["b"]
    assert "failed a policy check: needs a second signature" in blocked[0].message
    if approve:
        assert result.status is PlanStatus.SUCCEEDED
        assert tool.runs == Counter({"a": 1, "b": 2, "c": 1})
    else:
        assert result.status is PlanStatus.FAILED
        assert result.failures[0].failure_class is FailureClass.POLICY
        assert tool.runs == Counter({"a": 1, "b": 1})
