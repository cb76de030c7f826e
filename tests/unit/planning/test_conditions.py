"""Plans that decide: conditions (when), routes on failure (runs_on), continue_independent."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    ConditionRecord,
    Engine,
    EngineConfig,
    GateStep,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanStatus,
    PlanValidationError,
    SqliteStateStore,
    StepEvent,
    StepResult,
    StepStatus,
    ToolContext,
    ToolStep,
    replay,
    validate_plan,
)

from ._support import DictToolRunner, echo, make_plan, noop, tool_step


async def found(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"hits": input.get("hits", [])}


async def boom(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    raise LogicError("the search service refused the query")


def runner() -> DictToolRunner:
    return DictToolRunner({"noop": noop, "echo": echo, "found": found, "boom": boom})


def search_plan(hits: list[str], **fields: Any) -> Plan:
    return make_plan(
        tool_step("search", tool="found", input={"hits": hits}),
        tool_step(
            "read",
            "search",
            tool="echo",
            input={"first": {"$expr": "search.hits[0]"}},
            when="length(search.hits) > `0`",
        ),
        tool_step("ask", "search", when="length(search.hits) == `0`"),
        tool_step("report", "read"),
        **fields,
    )


async def test_a_false_condition_skips_the_step_and_what_needs_it() -> None:
    events: list[StepEvent] = []
    store = InMemoryStateStore()
    engine = Engine(tools=runner(), agent="perception", store=store)
    result = await engine.run(search_plan([]), on_event=events.append)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.statuses == {
        "search": StepStatus.SUCCEEDED,
        "read": StepStatus.SKIPPED,
        "ask": StepStatus.SUCCEEDED,
        "report": StepStatus.SKIPPED,
    }
    skipped = {e.step_id: e.message for e in events if e.status is StepStatus.SKIPPED}
    assert skipped == {
        "read": "condition 'length(search.hits) > `0`' is false (value: false)",
        "report": "dependency 'read' skipped",
    }
    journal = await store.journal("p1")
    conditions = [r for r in journal if isinstance(r, ConditionRecord)]
    assert {(r.step_id, r.holds, r.value_json) for r in conditions} == {
        ("read", False, "false"),
        ("ask", True, "true"),
    }
    skips = [r for r in journal if isinstance(r, StepResult) and r.status is StepStatus.SKIPPED]
    assert [(r.step_id, r.message) for r in skips] == list(skipped.items())
    # The condition is journaled before the step it decides starts.
    first = next(r for r in journal if getattr(r, "step_id", "") == "ask")
    assert isinstance(first, ConditionRecord)


async def test_a_true_condition_runs_the_step() -> None:
    result = await Engine(tools=runner(), agent="perception").run(search_plan(["a", "b"]))
    assert result.status is PlanStatus.SUCCEEDED
    assert result.statuses["ask"] is StepStatus.SKIPPED
    assert result.outputs["read"] == {"first": "a"}
    assert result.statuses["report"] is StepStatus.SUCCEEDED


async def test_a_condition_reads_the_plans_inputs() -> None:
    plan = make_plan(
        tool_step("en", when="inputs.language == 'en'"),
        tool_step("fr", when="inputs.language == 'fr'"),
        inputs={"language": "fr"},
    )
    result = await Engine(tools=runner(), agent="perception").run(plan)
    assert (result.statuses["en"], result.statuses["fr"]) == (
        StepStatus.SKIPPED,
        StepStatus.SUCCEEDED,
    )


def routed_plan(tool: str, **fields: Any) -> Plan:
    return make_plan(
        tool_step("search", tool=tool),
        tool_step("use", "search"),
        tool_step("fallback", "search", runs_on="failure"),
        tool_step("after", "fallback"),
        tool_step("other"),
        **fields,
    )


async def test_a_route_on_failure_runs_when_its_dependency_failed() -> None:
    events: list[StepEvent] = []
    result = await Engine(tools=runner(), agent="perception").run(
        routed_plan("boom"), on_event=events.append
    )
    # The failure is handled: the plan goes on and succeeds.
    assert result.status is PlanStatus.SUCCEEDED
    assert result.failures == []
    assert result.statuses == {
        "search": StepStatus.FAILED,
        "use": StepStatus.SKIPPED,
        "fallback": StepStatus.SUCCEEDED,
        "after": StepStatus.SUCCEEDED,
        "other": StepStatus.SUCCEEDED,
    }
    use = next(e for e in events if e.step_id == "use" and e.status is StepStatus.SKIPPED)
    assert use.message == "dependency 'search' failed"


async def test_a_route_on_failure_is_skipped_when_nothing_failed() -> None:
    events: list[StepEvent] = []
    result = await Engine(tools=runner(), agent="perception").run(
        routed_plan("noop"), on_event=events.append
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert (result.statuses["fallback"], result.statuses["after"]) == (
        StepStatus.SKIPPED,
        StepStatus.SKIPPED,
    )
    skipped = {e.step_id: e.message for e in events if e.status is StepStatus.SKIPPED}
    assert skipped["fallback"] == "it runs on failure, and no dependency failed"


class Slow:
    """A tool that takes a few loop turns, so independent branches are mid-way at a failure."""

    def __init__(self) -> None:
        self.done: list[str] = []

    async def __call__(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        for _ in range(5):
            await asyncio.sleep(0)
        self.done.append(ctx.step_id)
        return {"step": ctx.step_id}


def branches(**fields: Any) -> Plan:
    return make_plan(
        tool_step("bad", tool="boom"),
        tool_step("after-bad", "bad"),
        tool_step("b1", tool="slow", compensate="undo"),
        tool_step("b2", "b1", tool="slow", compensate="undo"),
        tool_step("b3", "b2", tool="slow"),
        **fields,
    )


async def test_fail_fast_stops_independent_branches() -> None:
    slow = Slow()
    tools = DictToolRunner({"boom": boom, "slow": slow, "noop": noop, "undo": noop})
    result = await Engine(tools=tools, agent="perception").run(branches())
    assert result.status is PlanStatus.FAILED
    assert "b3" not in slow.done
    assert result.statuses["b3"] is StepStatus.SKIPPED


async def test_continue_independent_lets_other_branches_finish_then_fails_and_compensates() -> None:
    slow = Slow()
    undone: list[str] = []

    async def undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        undone.append(ctx.step_id)
        return {}

    tools = DictToolRunner({"boom": boom, "slow": slow, "noop": noop, "undo": undo})
    result = await Engine(tools=tools, agent="perception").run(
        branches(on_failure="continue_independent")
    )
    assert slow.done == ["b1", "b2", "b3"]
    assert result.status is PlanStatus.FAILED
    assert [f.step_id for f in result.failures] == ["bad"]
    assert result.statuses["after-bad"] is StepStatus.SKIPPED
    assert (result.statuses["b1"], result.statuses["b2"]) == (
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
    )
    assert result.statuses["b3"] is StepStatus.SUCCEEDED
    assert undone == ["b2", "b1"]  # reverse completion order


def test_validation_of_conditions_and_routes() -> None:
    plan = make_plan(
        tool_step("a"),
        tool_step("b", "a", when="later.step == 'x'"),
        tool_step("c", "a", when="a.step ==="),
        tool_step("d", runs_on="failure"),
        tool_step("later", "b"),
    )
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan, tools={"noop"})
    assert info.value.problems == [
        "step 'b' condition references step 'later' in \"later.step == 'x'\", which is not "
        "among its (transitive) dependencies",
        "step 'c' has an invalid condition: expression 'a.step ===': does not parse at column "
        "9 near '=': Invalid jmespath expression",
        "step 'd' runs on failure but depends on no step: name the steps whose failure it "
        "handles in depends_on",
    ]


def gated_condition_plan() -> Plan:
    return Plan(
        id="cond",
        owner="perception",
        goal="decide after a gate",
        steps=[
            ToolStep(id="a", tool="noop"),
            GateStep(id="g", prompt="go on?", depends_on=["a"]),
            ToolStep(id="c", tool="noop", depends_on=["g"], when="a.step == 'a'"),
        ],
    )


async def test_a_resumed_run_takes_the_journaled_decision(tmp_path: Path) -> None:
    # The journal says c's condition did not hold: the resumed run skips c, although the
    # condition evaluated now would hold. Decisions are read back, never re-evaluated.
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner(), agent="perception", store=store)
        task = asyncio.create_task(engine.run(gated_condition_plan()))
        while (state := await store.load("cond")) is None or "g" not in state.gates:  # noqa: ASYNC110 - polls the store, as a second process would
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.commit([ConditionRecord("cond", 1, "c", False, "false")])
        await engine.decide("cond", "g", approve=True, approver="ann", rationale="ok", revision=1)
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner(), agent="perception", store=store)
        result = await engine.resume("cond")
    assert result.status is PlanStatus.SUCCEEDED
    assert result.statuses["c"] is StepStatus.SKIPPED


# --- crash anywhere, then resume ---------------------------------------------------------------


class Ledger:
    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.runs = 0

    async def effect(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.runs += 1
        await asyncio.sleep(0)
        self.effects[ctx.call_id] += 1
        await asyncio.sleep(0)
        return {"step": ctx.step_id, "n": int(ctx.step_id[1:])}

    async def fails(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.runs += 1
        await asyncio.sleep(0)
        raise LogicError("no luck")


def deciding_plan(seed: int, steps: int = 30) -> Plan:
    """Steps with conditions over a dependency's output, routes on failure and failing steps."""
    rng = random.Random(seed)
    out: list[ToolStep] = []
    for n in range(steps):
        deps = sorted({f"s{rng.randrange(n)}" for _ in range(rng.randint(1, 2))}) if n else []
        fields: dict[str, Any] = {}
        roll = rng.random()
        if deps and roll < 0.3:
            fields["when"] = f"{deps[0]}.n > `{rng.randrange(n)}`"
        elif deps and roll < 0.4:
            fields["runs_on"] = "failure"
        tool = "fails" if rng.random() < 0.1 else "effect"
        out.append(ToolStep(id=f"s{n}", tool=tool, depends_on=deps, **fields))
    return Plan(
        id=f"decide-{seed}",
        owner="tactical",
        goal="crash me",
        steps=out,
        on_failure="continue_independent",
    )


def ledger_engine(ledger: Ledger, store: Any) -> Engine:
    class Runner(DictToolRunner):
        def is_idempotent(self, name: str) -> bool:
            return True  # effects are keyed by call id: a re-run is the same effect

    return Engine(
        EngineConfig(max_in_flight=3),
        tools=Runner({"effect": ledger.effect, "fails": ledger.fails}),
        agent="tactical",
        store=store,
    )


@pytest.mark.parametrize("seed", range(12))
async def test_crash_anywhere_then_resume_decides_as_an_uninterrupted_run(
    seed: int, tmp_path: Path
) -> None:
    plan = deciding_plan(seed)
    reference_ledger = Ledger()
    reference = await ledger_engine(reference_ledger, None).run(plan)

    rng = random.Random(seed)
    ledger = Ledger()
    path = tmp_path / "state.db"
    store = SqliteStateStore(path)
    task = asyncio.create_task(ledger_engine(ledger, store).run(plan))
    crash_at = rng.randrange(1, max(2, reference_ledger.runs))
    while ledger.runs < crash_at and not task.done():  # noqa: ASYNC110 - counting loop turns
        await asyncio.sleep(0)
    for _ in range(rng.randrange(0, 6)):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await store.aclose()

    async with SqliteStateStore(path) as fresh:
        result = await ledger_engine(ledger, fresh).resume(plan.id)
        report = await replay(fresh, plan.id)
    assert result.statuses == reference.statuses
    assert result.status is reference.status
    # every effect that the uninterrupted run made, made once (idempotent re-runs aside: the
    # ledger counts them by call id, so an in-flight step re-run after the crash counts twice)
    assert set(ledger.effects) == set(reference_ledger.effects)
    assert not report.diverged, report.divergences


async def test_replay_re_derives_conditions_and_sees_a_changed_one() -> None:
    store = InMemoryStateStore()
    engine = Engine(tools=runner(), agent="perception", store=store)
    await engine.run(search_plan(["a"]))
    assert not (await replay(store, "p1")).diverged
    changed = await replay(store, "p1", outputs={"search": {"hits": []}})
    found_decisions = {(d.step_id, d.decision) for d in changed.divergences}
    assert ("read", "condition") in found_decisions
    assert ("ask", "condition") in found_decisions
    read = next(d for d in changed.divergences if (d.step_id, d.decision) == ("read", "condition"))
    assert (read.recorded, read.replayed) == ("true", "false")
