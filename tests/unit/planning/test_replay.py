"""Replay: a finished plan re-run from its recorded outputs, with no side effects."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from stratagem.planning import (
    Budget,
    Divergence,
    Engine,
    GateStep,
    InMemoryDispatcher,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanControlError,
    PlanStatus,
    RetryPolicy,
    StepEvent,
    StepStatus,
    ToolContext,
    ToolStep,
    TransientError,
    replay,
)
from stratagem.protocol import AnalyzeNarrativeRequest, AnalyzeNarrativeResponse, WireModel

from ._support import DictToolRunner, cross_step

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)


class World:
    """Tools with side effects (a ledger) and one flaky tool."""

    def __init__(self, flaky_failures: int = 1, fail_step: str = "") -> None:
        self.ledger: Counter[str] = Counter()
        self.flaky_failures = flaky_failures
        self.fail_step = fail_step

    async def read(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.ledger[ctx.step_id] += 1
        return {
            "text": "Mira finds the key.",
            "entities": [{"id": "mira", "name": "Mira", "kind": "character"}],
        }

    async def flaky(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.ledger[ctx.step_id] += 1
        if self.flaky_failures:
            self.flaky_failures -= 1
            raise TransientError("try again")
        return {"n": 3}

    async def write(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.ledger[ctx.step_id] += 1
        if ctx.step_id == self.fail_step:
            raise LogicError("cannot write that")
        return {"wrote": input}

    def runner(self) -> DictToolRunner:
        return DictToolRunner({"read": self.read, "flaky": self.flaky, "write": self.write})


def dispatcher() -> InMemoryDispatcher:
    d = InMemoryDispatcher()

    async def analyze(request: WireModel) -> WireModel:
        assert isinstance(request, AnalyzeNarrativeRequest)
        return AnalyzeNarrativeResponse(protagonist=request.entities[0].id, themes=["x"])

    d.register("strategic", "AnalyzeNarrative", analyze)
    return d


def story_plan(pid: str = "rp") -> Plan:
    return Plan(
        id=pid,
        owner="perception",
        goal="replay me",
        steps=[
            ToolStep(id="read", tool="read"),
            ToolStep(id="count", tool="flaky", retry=FAST),
            cross_step(
                "analyze",
                "strategic",
                "AnalyzeNarrative",
                {"text": {"$ref": "read.text"}, "entities": {"$ref": "read.entities"}},
                "read",
            ),
            GateStep(id="ok", prompt="Publish?", depends_on=["analyze", "count"]),
            ToolStep(
                id="publish",
                tool="write",
                depends_on=["ok"],
                input={"who": {"$ref": "analyze.protagonist"}, "n": {"$ref": "count.n"}},
            ),
        ],
    )


async def run_recorded(world: World, plan: Plan) -> tuple[InMemoryStateStore, InMemoryDispatcher]:
    store = InMemoryStateStore()
    d = dispatcher()
    engine = Engine(tools=world.runner(), dispatcher=d, agent="perception", store=store)

    def on_event(event: StepEvent) -> None:
        if event.step_id == "ok" and event.status is StepStatus.BLOCKED:
            asyncio.get_running_loop().create_task(
                engine.decide(
                    plan.id, "ok", approve=True, approver="ed", rationale="fine", revision=1
                )
            )

    await engine.run(plan, on_event=on_event)
    return store, d


async def test_an_unchanged_plan_replays_without_divergence_or_side_effects() -> None:
    world = World()
    store, d = await run_recorded(world, story_plan())
    before = Counter(world.ledger)
    assert before == Counter({"read": 1, "count": 2, "publish": 1})
    report = await replay(store, "rp")
    assert report.divergences == []
    assert not report.diverged
    assert (report.recorded_status, report.replayed_status) == (
        PlanStatus.SUCCEEDED,
        PlanStatus.SUCCEEDED,
    )
    assert world.ledger == before  # no tool ran
    assert len(d.calls) == 1  # no request was sent


async def test_a_changed_recorded_output_diverges_at_its_step() -> None:
    store, _ = await run_recorded(World(), story_plan())
    report = await replay(store, "rp", outputs={"count": {"n": 4}})
    assert [(d.step_id, d.decision) for d in report.divergences] == [("count", "output")]


async def test_a_changed_tool_output_from_new_tools_diverges_at_its_step() -> None:
    world = World()
    store, _ = await run_recorded(world, story_plan())
    other = World(flaky_failures=1)

    async def read_v2(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {
            "text": "Mira loses the key.",
            "entities": [{"id": "mira", "name": "Mira", "kind": "character"}],
        }

    tools = DictToolRunner({"read": read_v2, "flaky": other.flaky, "write": other.write})
    report = await replay(store, "rp", tools=tools)
    assert [(d.step_id, d.decision) for d in report.divergences] == [("read", "output")]


async def test_a_different_failure_is_reported_as_outcomes_status_and_plan_status() -> None:
    store, _ = await run_recorded(World(), story_plan())
    other = World(flaky_failures=0, fail_step="publish")
    report = await replay(store, "rp", tools=other.runner())
    assert report.divergences == [
        Divergence("count", "outcomes", "transient, succeeded", "succeeded"),
        Divergence("publish", "outcomes", "succeeded", "logic"),
        Divergence("publish", "status", "succeeded", "failed"),
        Divergence("publish", "output", report.divergences[3].recorded, ""),
        Divergence("", "plan_status", "succeeded", "failed"),
    ]


async def test_a_failed_plan_replays_its_failure_without_divergence() -> None:
    world = World(flaky_failures=5)  # count fails for good after 3 attempts
    store, _ = await run_recorded(world, story_plan("rf"))
    state = await store.load("rf")
    assert state is not None
    assert state.status is PlanStatus.FAILED
    report = await replay(store, "rf")
    assert report.divergences == []
    assert report.replayed_status is PlanStatus.FAILED


class PricedRunner(DictToolRunner):
    def cost(self, name: str) -> float:
        return 0.5


async def test_a_replay_reserves_what_the_run_reserved_from_the_budget() -> None:
    # Three calls at 0.5 fit a budget of 1.5; at the default 1.0 the second would be refused.
    store = InMemoryStateStore()
    world = World()
    engine = Engine(tools=PricedRunner({"read": world.read}), agent="perception", store=store)
    steps = [
        ToolStep(id="a", tool="read"),
        ToolStep(id="b", tool="read", depends_on=["a"]),
        ToolStep(id="c", tool="read", depends_on=["b"]),
    ]
    plan = Plan(
        id="rb", owner="perception", goal="spend", steps=steps, budget=Budget(cost_units=1.5)
    )
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    report = await replay(store, "rb")
    assert report.divergences == []
    assert report.replayed_status is PlanStatus.SUCCEEDED


async def test_only_finished_plans_replay() -> None:
    store = InMemoryStateStore()
    await store.save_plan(story_plan("open"))
    with pytest.raises(PlanControlError, match="only a finished plan replays"):
        await replay(store, "open")
    with pytest.raises(PlanControlError, match="not in the store"):
        await replay(store, "nope")
