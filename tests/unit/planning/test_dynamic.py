"""Dynamic steps: maps over run-time lists, bounded loops, sub-plans, priorities.

Each form's behaviour, and the promises that hold for it: bounds, per-item idempotency keys,
fan-in in item order, journaled decisions (replay re-derives them), budgets, compensation in
reverse order across expanded steps, spans, and bad input refused before anything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.planning import (
    Budget,
    CrossAgentCall,
    Engine,
    EngineConfig,
    ForkError,
    GateDecisionError,
    InMemoryDispatcher,
    InMemoryStateStore,
    IterationRecord,
    LogicError,
    MapRecord,
    Plan,
    PlanStatus,
    PlanValidationError,
    SqliteStateStore,
    StepEvent,
    StepStatus,
    ToolApproval,
    ToolContext,
    diff_plans,
    replay,
    validate_plan,
)
from stratagem.protocol import AnalyzeNarrativeRequest, AnalyzeNarrativeResponse, WireModel

from ._support import FAST_RETRY, Concurrency, DictToolRunner, echo, noop


async def double(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"n": input["n"] * 2, "key": ctx.call_id}


def plan_of(*steps: dict[str, Any], **fields: Any) -> Plan:
    return Plan(id="p", owner="tactical", goal="test dynamic steps", steps=list(steps), **fields)


def mapping(**fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "kind": "map",
        "id": "m",
        "over": "inputs.ns",
        "max_items": 100,
        "tool": "double",
        "input": {"n": {"$expr": "item"}},
    }
    step.update(fields)
    return step


def tools(**more: Any) -> DictToolRunner:
    return DictToolRunner({"noop": noop, "echo": echo, "double": double, **more})


# --- maps ---------------------------------------------------------------------------------------


async def test_a_map_runs_each_item_with_its_own_key_and_collects_in_item_order() -> None:
    store = InMemoryStateStore()
    events: list[StepEvent] = []
    plan = plan_of(
        {"kind": "tool", "id": "src", "tool": "echo", "input": {"ns": [3, 1, 2]}},
        mapping(over="src.ns", depends_on=["src"]),
        {
            "kind": "tool",
            "id": "sum",
            "tool": "echo",
            "depends_on": ["m"],
            "input": {"total": {"$expr": "sum(m.items[*].n)"}},
        },
    )
    result = await Engine(tools=tools(), agent="tactical", store=store).run(
        plan, on_event=events.append
    )
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["m"] == {
        "items": [
            {"n": 6, "key": "p@1:m.0"},
            {"n": 2, "key": "p@1:m.1"},
            {"n": 4, "key": "p@1:m.2"},
        ]
    }
    assert result.outputs["sum"] == {"total": 12}
    # The expansion is an event of the step, and a decision in the journal before any item.
    assert ("m", "map over 3 item(s)") in [(e.step_id, e.message) for e in events]
    journal = await store.journal("p")
    kinds = [(type(r).__name__, getattr(r, "step_id", "")) for r in journal]
    assert kinds.index(("MapRecord", "m")) < kinds.index(("StepIntent", "m.0"))
    [record] = [r for r in journal if isinstance(r, MapRecord)]
    assert (record.items, len(record.digest)) == (3, 16)
    # Items are not steps: the plan's statuses name its own steps only.
    assert set(result.statuses) == {"src", "m", "sum"}


async def test_a_map_runs_at_most_max_parallel_items_at_once() -> None:
    busy = Concurrency(hold_s=0.002)
    plan = plan_of(mapping(tool="busy", input={}, max_parallel=3), inputs={"ns": list(range(12))})
    runner = tools(busy=busy)
    result = await Engine(tools=runner, agent="tactical").run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert busy.max == 3
    assert sorted(busy.started) == sorted(f"m.{i}" for i in range(12))
    assert len(result.outputs["m"]["items"]) == 12


async def test_a_map_over_an_empty_list_succeeds_with_no_items() -> None:
    result = await Engine(tools=tools(), agent="tactical").run(
        plan_of(mapping(), inputs={"ns": []})
    )
    assert (result.status, result.outputs["m"]) == (PlanStatus.SUCCEEDED, {"items": []})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"ns": {"a": 1}}, "'over' (src.ns) gave an object, not a list"),
        ({"ns": list(range(5))}, "'over' (src.ns) gave 5 items, more than max_items 4"),
    ],
)
async def test_a_map_over_what_is_not_a_list_or_too_long_fails_before_any_item(
    source: dict[str, Any], message: str
) -> None:
    runner = tools()
    plan = plan_of(
        {"kind": "tool", "id": "src", "tool": "echo", "input": source},
        mapping(over="src.ns", depends_on=["src"], max_items=4),
    )
    result = await Engine(tools=runner, agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert (failure.step_id, failure.message) == ("m", message)
    assert [call[0] for call in runner.calls] == ["echo"]  # no item ran


@pytest.mark.parametrize("over", ["src.rows[]", "src.rows[*][*]", "src.rows[*][?@ > `-1`]"])
async def test_a_map_list_is_bounded_while_it_is_built_not_after(over: str) -> None:
    # 10,000 rows of 1,000 (one list shared, as an in-process tool may answer): flattening or
    # projecting them built 10^7 items (4-5 s of the event loop) before max_items was checked.
    async def rows(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"rows": [list(range(1000))] * 10_000}

    runner = DictToolRunner({"rows": rows, "double": double})
    plan = plan_of(
        {"kind": "tool", "id": "src", "tool": "rows"},
        mapping(over=over, depends_on=["src"], max_items=4),
    )
    result = await Engine(tools=runner, agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.message == (
        f"its list cannot be evaluated: expression {over!r}: it gives more than max_items 4 "
        "items (stopped there)"
    )
    assert [call[0] for call in runner.calls] == ["rows"]  # no item ran


def test_a_bounded_list_is_the_same_list_when_within_the_bound() -> None:
    from stratagem.planning import expression

    outputs = {"src": {"rows": [[1, 2], [3]], "hits": [{"u": "a", "s": 1}, {"u": "b", "s": 0}]}}
    for text in ("src.rows[]", "src.rows[*][0]", "src.hits[?s > `0`].u", "src.hits[0].*"):
        assert expression(text).evaluate(outputs, None, max_items=3) == expression(text).evaluate(
            outputs, None
        )


async def test_a_failed_item_fails_the_map_and_items_and_steps_compensate_newest_first() -> None:
    undone: list[str] = []

    async def flaky_double(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if input["n"] == 3:
            raise LogicError("three is not allowed")
        return {"n": input["n"] * 2}

    async def undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        undone.append(f"{ctx.step_id}:{input.get('item', input.get('output'))}")
        return {}

    plan = plan_of(
        {"kind": "tool", "id": "first", "tool": "noop", "compensate": "undo"},
        mapping(
            depends_on=["first"],
            tool="flaky",
            max_parallel=1,
            compensate="undo",
            compensate_input={"item": {"$expr": "item"}},
        ),
        inputs={"ns": [1, 2, 3, 4]},
    )
    runner = tools(flaky=flaky_double, undo=undo)
    result = await Engine(tools=runner, agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.step_id == "m"
    assert failure.message == "item 2 failed after 1 attempt(s): three is not allowed"
    # Item 3 never started (max_parallel 1, the map stopped); items 1 and 0, then the step.
    assert undone == ["m.1:2", "m.0:1", "first:{'step': 'first'}"]


async def test_each_item_is_retried_on_its_own() -> None:
    tries: dict[str, int] = {}

    async def shaky(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        tries[ctx.step_id] = ctx.attempt
        if ctx.attempt == 1 and input["n"] % 2:
            from stratagem.planning import TransientError

            raise TransientError("busy")
        return {"n": input["n"]}

    plan = plan_of(mapping(tool="shaky", retry=FAST_RETRY), inputs={"ns": [1, 2, 3]})
    result = await Engine(tools=tools(shaky=shaky), agent="tactical").run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert tries == {"m.0": 2, "m.1": 1, "m.2": 2}


async def test_a_map_sends_one_cross_agent_request_per_item_with_its_own_request_id() -> None:
    dispatcher = InMemoryDispatcher()
    seen: list[tuple[str, str]] = []

    async def analyze(request: WireModel) -> WireModel:
        assert isinstance(request, AnalyzeNarrativeRequest)
        return AnalyzeNarrativeResponse(protagonist=request.text.split()[0].lower())

    original = dispatcher.dispatch

    async def recording(call: CrossAgentCall) -> WireModel:
        seen.append((call.step_id, call.request_id))
        return await original(call)

    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    dispatcher.dispatch = recording  # type: ignore[method-assign]
    plan = plan_of(
        {
            "kind": "map",
            "id": "m",
            "over": "inputs.passages",
            "max_items": 10,
            "target": "strategic",
            "capability": "AnalyzeNarrative",
            "request": {"text": {"$expr": "item"}},
        },
        inputs={"passages": ["Mira waits.", "Tomas runs."]},
    )
    validate_plan(plan, tools={"noop"})
    result = await Engine(tools=tools(), dispatcher=dispatcher, agent="tactical").run(plan)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert [item["protagonist"] for item in result.outputs["m"]["items"]] == ["mira", "tomas"]
    assert sorted(seen) == [("m.0", "p@1:m.0"), ("m.1", "p@1:m.1")]


# --- loops and sub-plans -----------------------------------------------------------------------


def counting_loop(**fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "kind": "loop",
        "id": "l",
        "max_iterations": 5,
        "until": "count.n >= `3`",
        "inputs": {"start": {"$expr": "inputs.start"}},
        "steps": [
            {
                "kind": "tool",
                "id": "count",
                "tool": "echo",
                "input": {
                    "n": {"$expr": "inputs.iteration"},
                    "before": {"$expr": "inputs.last.count.n"},
                    "start": {"$expr": "inputs.start"},
                },
            }
        ],
    }
    step.update(fields)
    return step


async def test_a_loop_repeats_its_body_until_its_condition_holds() -> None:
    store = InMemoryStateStore()
    nested: dict[str, list[StepEvent]] = {}
    events: list[StepEvent] = []
    engine = Engine(
        tools=tools(),
        agent="tactical",
        store=store,
        nested_events=lambda plan: nested.setdefault(plan.id, []).append,
    )
    result = await engine.run(plan_of(counting_loop(), inputs={"start": 7}), on_event=events.append)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["l"] == {
        "iterations": 3,
        "done": True,
        "last": {"count": {"n": 3, "before": 2, "start": 7}},
    }
    # Each iteration is a plan of its own, with its own events and journal.
    assert list(nested) == ["p/l.1", "p/l.2", "p/l.3"]
    second = await store.load("p/l.2")
    assert second is not None
    assert second.outputs == {"count": {"n": 2, "before": 1, "start": 7}}
    assert second.plan(Plan).parent == "p@1:l"
    messages = [e.message for e in events if e.step_id == "l" and e.message]
    assert messages == [
        "iteration 1 ended (not_held): until 'count.n >= `3`' gave false",
        "iteration 2 ended (not_held): until 'count.n >= `3`' gave false",
        "iteration 3 ended (held): until 'count.n >= `3`' gave true",
    ]
    outcomes = [
        (r.iteration, r.outcome) for r in await store.journal("p") if isinstance(r, IterationRecord)
    ]
    assert outcomes == [
        (1, "started"),
        (1, "not_held"),
        (2, "started"),
        (2, "not_held"),
        (3, "started"),
        (3, "held"),
    ]


async def test_a_loop_that_reaches_its_bound_fails_or_succeeds_as_it_says() -> None:
    plan = plan_of(counting_loop(max_iterations=2))
    result = await Engine(tools=tools(), agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].message == (
        "it reached its bound (max_iterations 2) after 2 iteration(s) without 'until' "
        "(count.n >= `3`) holding"
    )
    lenient = plan_of(counting_loop(max_iterations=2, on_exhausted="succeed"))
    result = await Engine(tools=tools(), agent="tactical").run(lenient)
    assert result.status is PlanStatus.SUCCEEDED
    assert (result.outputs["l"]["iterations"], result.outputs["l"]["done"]) == (2, False)


async def test_a_timeboxed_loop_starts_no_iteration_past_its_timebox() -> None:
    now = [1000.0]

    async def tick(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        now[0] += 4.0  # each iteration takes four seconds of the (fake) clock
        return {"n": 0}

    plan = plan_of(
        counting_loop(
            max_iterations=None,
            timebox_s=10.0,
            until=None,
            steps=[{"kind": "tool", "id": "count", "tool": "tick"}],
        )
    )
    engine = Engine(tools=tools(tick=tick), agent="tactical", clock=lambda: now[0])
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["l"]["iterations"] == 3  # started at 0, 4 and 8 s; not at 12 s


async def test_a_failed_iteration_fails_the_loop_with_its_cause() -> None:
    iteration = {"$expr": "inputs.iteration"}

    async def boom(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if input["n"] == 2:
            raise LogicError("no second time")
        return {"n": input["n"]}

    body = [{"kind": "tool", "id": "count", "tool": "boom", "input": {"n": iteration}}]
    plan = plan_of(counting_loop(steps=body))
    result = await Engine(tools=tools(boom=boom), agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].message == (
        "iteration 2 (p/l.2) failed: step 'count' failed (logic): no second time"
    )


async def test_a_subplan_runs_a_nested_plan_and_gives_its_outputs() -> None:
    nested: list[str] = []
    x = {"$expr": "inputs.x"}
    plan = plan_of(
        {"kind": "tool", "id": "a", "tool": "echo", "input": {"x": 2}},
        {
            "kind": "subplan",
            "id": "s",
            "depends_on": ["a"],
            "inputs": {"x": {"$expr": "a.x"}},
            "steps": [
                {"kind": "tool", "id": "b", "tool": "double", "input": {"n": x}},
                {
                    "kind": "tool",
                    "id": "c",
                    "tool": "echo",
                    "depends_on": ["b"],
                    "input": {"n": {"$expr": "b.n"}},
                },
            ],
        },
    )
    engine = Engine(tools=tools(), agent="tactical", nested_events=lambda p: nested.append(p.id))
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["s"] == {"b": {"n": 4, "key": "p/s@1:b"}, "c": {"n": 4}}
    assert nested == ["p/s"]


async def test_a_gate_inside_a_loop_is_decided_by_its_nested_plans_id() -> None:
    store = InMemoryStateStore()
    engine = Engine(tools=tools(), agent="tactical", store=store)
    plan = plan_of(
        counting_loop(
            max_iterations=1, until=None, steps=[{"kind": "gate", "id": "ok", "prompt": "go on?"}]
        )
    )
    running = asyncio.create_task(engine.run(plan))
    while (state := await store.load("p/l.1")) is None or "ok" not in state.gates:  # noqa: ASYNC110 - polls the store
        await asyncio.sleep(0.001)
    await engine.decide("p/l.1", "ok", approve=True, approver="ann", rationale="yes", revision=1)
    result = await running
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["l"]["last"]["ok"]["approver"] == "ann"


# --- budgets, priorities, compensation, spans --------------------------------------------------


async def test_budgets_count_every_item_and_every_iteration() -> None:
    plan = plan_of(
        mapping(),
        counting_loop(depends_on=["m"], until=None, max_iterations=4),
        inputs={"ns": [1, 2, 3], "start": 0},
        budget=Budget(tool_calls=5),
    )
    result = await Engine(tools=tools(), agent="tactical").run(plan)
    assert result.status is PlanStatus.FAILED
    # three items, then two iterations of one call each: the third iteration has no call left
    assert result.failures[0].failure_class.value == "policy"
    assert "iteration 3 (p/l.3)" in result.failures[0].message
    assert "budget exhausted: tool_calls 0/0 used" in result.failures[0].message


async def test_higher_priority_ready_steps_start_first_under_the_bound() -> None:
    busy = Concurrency(hold_s=0.001)
    plan = plan_of(
        *(
            {"kind": "tool", "id": name, "tool": "busy", "priority": priority}
            for name, priority in [("low", -1), ("plain", 0), ("high", 5), ("higher", 9)]
        ),
        max_in_flight=1,
    )
    result = await Engine(tools=tools(busy=busy), agent="tactical").run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert busy.started == ["higher", "high", "plain", "low"]


async def test_compensation_runs_in_reverse_order_across_items_and_iterations() -> None:
    undone: list[str] = []

    async def undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        undone.append(f"{ctx.plan_id}:{ctx.step_id}")
        return {}

    async def boom(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise LogicError("the last step fails")

    plan = plan_of(
        {"kind": "tool", "id": "a", "tool": "noop", "compensate": "undo"},
        mapping(depends_on=["a"], max_parallel=1, compensate="undo"),
        counting_loop(
            depends_on=["m"],
            until=None,
            max_iterations=2,
            steps=[
                {"kind": "tool", "id": "x", "tool": "noop", "compensate": "undo"},
                {
                    "kind": "tool",
                    "id": "y",
                    "tool": "noop",
                    "depends_on": ["x"],
                    "compensate": "undo",
                },
            ],
        ),
        {"kind": "tool", "id": "z", "tool": "boom", "depends_on": ["l"]},
        inputs={"ns": [1, 2], "start": 0},
    )
    for store in (None, InMemoryStateStore()):
        undone.clear()
        engine = Engine(tools=tools(undo=undo, boom=boom), agent="tactical", store=store)
        result = await engine.run(plan)
        assert result.status is PlanStatus.FAILED
        assert undone == [
            "p/l.2:y",
            "p/l.2:x",
            "p/l.1:y",
            "p/l.1:x",
            "p:m.1",
            "p:m.0",
            "p:a",
        ], store
    # With a store, an undone nested plan ends cancelled, its steps compensated.
    assert store is not None
    iteration = await store.load("p/l.1")
    assert iteration is not None
    assert iteration.status is PlanStatus.CANCELLED
    assert {c.step_id: c.status.value for c in iteration.compensations} == {
        "x": "compensated",
        "y": "compensated",
    }


@pytest.mark.parametrize("durable", [False, True])
async def test_cancelling_a_plan_mid_iteration_undoes_what_the_iteration_did(
    durable: bool,
) -> None:
    undone: list[str] = []
    started = asyncio.Event()

    async def undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        undone.append(f"{ctx.plan_id}:{ctx.step_id}")
        return {}

    async def stuck(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    plan = plan_of(
        counting_loop(
            until=None,
            max_iterations=2,
            steps=[
                {"kind": "tool", "id": "x", "tool": "noop", "compensate": "undo"},
                {"kind": "tool", "id": "y", "tool": "stuck", "depends_on": ["x"]},
            ],
        )
    )
    store = InMemoryStateStore() if durable else None
    engine = Engine(tools=tools(undo=undo, stuck=stuck), agent="tactical", store=store)
    running = asyncio.create_task(engine.run(plan))
    await started.wait()
    await engine.cancel("p")
    result = await running
    assert result.status is PlanStatus.CANCELLED
    assert undone == ["p/l.1:x"]
    if store is not None:
        nested = await store.load("p/l.1")
        assert nested is not None
        assert nested.status is PlanStatus.CANCELLED


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


async def test_a_span_per_item_bounded_and_one_per_iteration(
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plan = plan_of(
        mapping(max_items=1000, max_parallel=8),
        counting_loop(depends_on=["m"]),
        inputs={"ns": list(range(150)), "start": 0},
    )
    engine = Engine(tools=tools(), agent="tactical", tracer_provider=provider)
    result = await engine.run(plan)
    provider.shutdown()
    assert result.status is PlanStatus.SUCCEEDED
    names = [span.name for span in exporter.get_finished_spans()]
    items = [name for name in names if name.startswith("step m.")]
    assert len(items) == 100  # the first hundred items; the map's span counts the rest
    [map_span] = [s for s in exporter.get_finished_spans() if s.name == "step m"]
    assert map_span.attributes is not None
    assert map_span.attributes["stratagem.map.items"] == 150
    # One plan span per iteration (each a nested plan), under the parent's plan span.
    runs = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent tactical"]
    assert len(runs) == 1 + 3
    [parent] = [s for s in runs if s.parent is None]
    assert parent.context is not None
    assert all(
        s.parent is not None and s.parent.span_id == parent.context.span_id
        for s in runs
        if s is not parent
    )
    assert all(s.attributes and s.attributes["stratagem.plan.id"] for s in runs)


# --- durable: journal, resume, replay ----------------------------------------------------------


async def test_replay_re_derives_expansions_and_iterations_and_sees_changes() -> None:
    store = InMemoryStateStore()
    plan = plan_of(
        {"kind": "tool", "id": "src", "tool": "echo", "input": {"ns": [1, 2, 3]}},
        mapping(over="src.ns", depends_on=["src"]),
        counting_loop(depends_on=["m"], inputs={"start": {"$expr": "length(m.items)"}}),
        {
            "kind": "subplan",
            "id": "s",
            "depends_on": ["l"],
            "steps": [{"kind": "tool", "id": "b", "tool": "noop"}],
        },
    )
    engine = Engine(tools=tools(), agent="tactical", store=store)
    assert (await engine.run(plan)).status is PlanStatus.SUCCEEDED
    report = await replay(store, "p")
    assert not report.diverged, report.divergences
    changed = await replay(store, "p", outputs={"src": {"ns": [1, 2]}})
    found = {(d.step_id, d.decision): (d.recorded, d.replayed) for d in changed.divergences}
    assert found[("m", "expansion")] == ("3 items", "2 items")


async def test_replay_sees_a_loop_decide_otherwise() -> None:
    store = InMemoryStateStore()
    plan = plan_of(counting_loop(until="count.start == `1`"), inputs={"start": 1})
    assert (await Engine(tools=tools(), agent="tactical", store=store).run(plan)).status is (
        PlanStatus.SUCCEEDED
    )
    assert not (await replay(store, "p")).diverged
    # The first iteration's step served otherwise: the loop decides to go on, which the
    # original never did (so the replay gets stuck there, and says so).
    changed = await replay(store, "p", outputs={"l.1/count": {"n": 1, "start": 0}}, timeout_s=0.5)
    found = {(d.step_id, d.decision): (d.recorded, d.replayed) for d in changed.divergences}
    assert found[("l", "iterations")] == ("held", "not_held")
    assert found[("", "plan_status")] == ("succeeded", "stuck")


async def test_a_resumed_map_runs_only_its_unfinished_items(tmp_path: Path) -> None:
    calls: list[str] = []
    gate = asyncio.Event()

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls.append(ctx.step_id)
        if input["n"] >= 3:
            await gate.wait()
        return {"n": input["n"]}

    class Runner(DictToolRunner):
        def is_idempotent(self, name: str) -> bool:
            return True

    plan = plan_of(mapping(tool="slow", max_parallel=1), inputs={"ns": [0, 1, 2, 3, 4]})
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=Runner({"slow": slow}), agent="tactical", store=store)
        running = asyncio.create_task(engine.run(plan))
        while "m.3" not in calls:  # noqa: ASYNC110 - waits for the item to start
            await asyncio.sleep(0.001)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    gate.set()
    calls.clear()
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=Runner({"slow": slow}), agent="tactical", store=store)
        result = await engine.resume("p")
        assert result.status is PlanStatus.SUCCEEDED
        assert calls == ["m.3", "m.4"]  # items 0-2 were done; 3 was in flight (idempotent)
        assert [item["n"] for item in result.outputs["m"]["items"]] == [0, 1, 2, 3, 4]
        assert not (await replay(store, "p")).diverged


@pytest.mark.parametrize("happened", [False, True])
async def test_a_non_idempotent_item_in_flight_holds_the_map_at_a_reconcile_gate(
    tmp_path: Path, happened: bool
) -> None:
    started: list[str] = []

    async def effect(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        started.append(ctx.step_id)
        if ctx.step_id == "m.1" and ctx.attempt == 1:
            await asyncio.Event().wait()  # in flight until the crash
        return {"n": input["n"]}

    plan = plan_of(mapping(tool="effect", max_parallel=1), inputs={"ns": [0, 1, 2]})
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        running = asyncio.create_task(
            Engine(tools=tools(effect=effect), agent="tactical", store=store).run(plan)
        )
        while "m.1" not in started:  # noqa: ASYNC110 - waits for the item to start
            await asyncio.sleep(0.001)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=tools(effect=effect), agent="tactical", store=store)
        resumed = asyncio.create_task(engine.resume("p"))
        while (state := await store.load("p")) is None or "m" not in state.gates:  # noqa: ASYNC110 - polls the store
            await asyncio.sleep(0.001)
        assert "m.1" in state.gates["m"].prompt
        # The operator checked the item's system of record: it happened (give its output), or
        # it did not (approve a re-run).
        output = {"items": {"1": {"n": 1}}} if happened else None
        await engine.decide(
            "p", "m", approve=True, approver="ann", rationale="checked", revision=1, output=output
        )
        result = await resumed
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["m"]["items"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert started == (["m.0", "m.1", "m.2"] if happened else ["m.0", "m.1", "m.1", "m.2"])


async def test_a_map_reconcile_decision_given_while_no_engine_runs_is_applied_on_resume(
    tmp_path: Path,
) -> None:
    started: list[str] = []

    async def effect(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        started.append(ctx.step_id)
        if ctx.step_id == "m.1" and ctx.attempt == 1:
            await asyncio.Event().wait()
        return {"n": input["n"]}

    plan = plan_of(mapping(tool="effect", max_parallel=1), inputs={"ns": [0, 1, 2]})
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=tools(effect=effect), agent="tactical", store=store)
        running = asyncio.create_task(engine.run(plan))
        while "m.1" not in started:  # noqa: ASYNC110 - waits for the item to start
            await asyncio.sleep(0.001)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        # The agent is down: the decision goes to the store; a bad output is refused first.
        with pytest.raises(GateDecisionError, match="no open gate"):
            await engine.decide("p", "nope", approve=True, approver="a", rationale="", revision=1)
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=tools(effect=effect), agent="tactical", store=store)
        paused = asyncio.create_task(engine.resume("p"))
        while (state := await store.load("p")) is None or "m" not in state.gates:  # noqa: ASYNC110 - polls the store
            await asyncio.sleep(0.001)
        with pytest.raises(GateDecisionError, match="reconcile gate takes"):
            await engine.decide(
                "p", "m", approve=True, approver="a", rationale="", revision=1, output={"n": 1}
            )
        paused.cancel()
        with pytest.raises(asyncio.CancelledError):
            await paused
        await engine.decide(
            "p",
            "m",
            approve=True,
            approver="ann",
            rationale="it happened",
            revision=1,
            output={"items": {"1": {"n": 1}}},
        )
    started.clear()
    async with SqliteStateStore(path) as store:
        result = await Engine(tools=tools(effect=effect), agent="tactical", store=store).resume("p")
        assert result.status is PlanStatus.SUCCEEDED
        assert started == ["m.2"]
        assert not (await replay(store, "p")).diverged


# --- revisions and validation ------------------------------------------------------------------


def test_a_diff_shows_changes_inside_a_loops_body() -> None:
    old = plan_of(counting_loop())
    body = [*counting_loop()["steps"], {"kind": "tool", "id": "more", "tool": "noop"}]
    body[0] = {**body[0], "tool": "noop"}
    new = plan_of(counting_loop(steps=body))
    [change] = diff_plans(old, new).changed
    assert change.step_id == "l"
    assert change.fields == ["steps", "steps/+more", "steps/count.tool"]


async def test_an_unchanged_map_carries_its_succeeded_items_into_a_new_revision() -> None:
    async def fussy(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if input["n"] == 2:
            raise LogicError("two is odd here")
        return {"n": input["n"]}

    store = InMemoryStateStore()
    engine = Engine(tools=tools(fussy=fussy), agent="tactical", store=store)
    plan = plan_of(mapping(tool="fussy", max_parallel=1), inputs={"ns": [0, 1, 2]})
    assert (await engine.run(plan)).status is PlanStatus.FAILED
    new = {"kind": "tool", "id": "new", "tool": "noop"}
    fixed = plan_of(mapping(tool="fussy", max_parallel=1), new, inputs={"ns": [0, 1, 2]})
    revision = await engine.replan("p", fixed, rationale="add a step", author="ann")
    assert revision.record.carried == ["m.0", "m.1"]


@pytest.mark.parametrize(
    ("step", "inputs", "problem"),
    [
        (
            mapping(over="length(inputs.ns)"),
            {},
            "step 'm' maps over a number, not a list ('over': 'length(inputs.ns)')",
        ),
        (
            mapping(max_items=2),
            {"ns": [1, 2, 3]},
            "step 'm' maps over 3 items, more than its max_items 2",
        ),
        (mapping(), {"ns": "abc"}, "step 'm' maps over a string, not a list ('over': 'inputs.ns')"),
        (
            mapping(over="inputs.ns[?"),
            {},
            "step 'm' has an invalid list ('over'): expression 'inputs.ns[?': the expression is "
            "incomplete",
        ),
        (
            mapping(tool="elsewhere"),
            {"ns": []},
            "step 'm' uses tool 'elsewhere', which is not in the tactical agent's registry",
        ),
        (
            counting_loop(max_iterations=None),
            {},
            "step 'l' is a loop without a bound: give max_iterations, timebox_s or both",
        ),
        (
            counting_loop(until="other.n > `1`"),
            {},
            "step 'l' until reads 'other', which is not a step of its body (count)",
        ),
        (
            counting_loop(steps=[{"kind": "tool", "id": "x", "tool": "elsewhere"}], until=None),
            {},
            "step 'l' body: step 'x' uses tool 'elsewhere', which is not in the tactical agent's "
            "registry",
        ),
        (
            counting_loop(inputs={"iteration": 1}),
            {},
            "step 'l' has an input 'iteration', which the loop sets itself (inputs.iteration, "
            "inputs.last)",
        ),
    ],
)
def test_bad_dynamic_steps_are_refused_before_the_plan_runs(
    step: dict[str, Any], inputs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan_of(step, inputs=inputs), tools={"noop", "echo", "double"})
    assert problem in info.value.problems


def test_nesting_is_bounded() -> None:
    step: dict[str, Any] = {"kind": "tool", "id": "leaf", "tool": "noop"}
    for depth in range(4):
        step = {"kind": "subplan", "id": f"s{depth}", "steps": [step]}
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan_of(step), tools={"noop"})
    assert info.value.problems == [
        "step 's3' body: step 's2' body: step 's1' body: step 's0' nests plans more than 3 "
        "levels deep"
    ]


async def test_engine_config_bound_applies_to_a_nested_plan() -> None:
    busy = Concurrency(hold_s=0.001)
    plan = plan_of(
        {
            "kind": "subplan",
            "id": "s",
            "max_in_flight": 2,
            "steps": [{"kind": "tool", "id": f"t{i}", "tool": "busy"} for i in range(6)],
        }
    )
    result = await Engine(EngineConfig(max_in_flight=8), tools=tools(busy=busy), agent="t").run(
        plan
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert busy.max == 2
    assert result.statuses == {"s": StepStatus.SUCCEEDED}


# --- crash anywhere mid-map or mid-loop, then resume ------------------------------------------


class Ledger:
    """A service whose effects are keyed by idempotency key: a repeated key is not applied twice
    (so a re-run of an idempotent step after a crash is safe), and every call is counted."""

    def __init__(self) -> None:
        self.applied: dict[str, int] = {}
        self.calls = 0

    async def effect(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.calls += 1
        await asyncio.sleep(0)
        self.applied.setdefault(ctx.call_id, 0)
        if not ctx.compensating:
            self.applied[ctx.call_id] = 1  # applied once, however often it is asked
        await asyncio.sleep(0)
        return {"step": ctx.step_id, "n": int(input.get("n", 1))}


def dynamic_plan(seed: int) -> Plan:
    """Maps, loops, sub-plans and plain steps, with data flowing between them."""
    rng = random.Random(seed)
    steps: list[dict[str, Any]] = []
    for n in range(7):
        deps = sorted({f"s{rng.randrange(n)}" for _ in range(rng.randint(0, 2))}) if n else []
        roll = rng.random()
        step: dict[str, Any] = {"id": f"s{n}", "depends_on": deps}
        if roll < 0.35:
            step.update(
                kind="map",
                over=f"inputs.xs[0:{rng.randint(0, 6)}]",
                max_items=10,
                max_parallel=rng.randint(1, 3),
                tool="effect",
                input={"n": {"$expr": "item"}},
            )
        elif roll < 0.6:
            step.update(
                kind="loop",
                max_iterations=4,
                until=f"b1.n >= `{rng.randint(1, 3)}`",
                steps=[
                    {"kind": "tool", "id": "b0", "tool": "effect"},
                    {
                        "kind": "tool",
                        "id": "b1",
                        "tool": "effect",
                        "depends_on": ["b0"],
                        "input": {"n": {"$expr": "inputs.iteration"}},
                    },
                ],
            )
        elif roll < 0.75:
            step.update(
                kind="subplan",
                steps=[
                    {"kind": "tool", "id": "c0", "tool": "effect"},
                    {
                        "kind": "map",
                        "id": "c1",
                        "over": "inputs.xs",
                        "max_items": 5,
                        "tool": "effect",
                        "input": {"n": {"$expr": "item"}},
                    },
                ],
                inputs={"xs": [1, 2]},
            )
        else:
            step.update(kind="tool", tool="effect")
        steps.append(step)
    return Plan(
        id=f"dyn-{seed}",
        owner="tactical",
        goal="crash me",
        steps=steps,
        inputs={"xs": [1, 2, 3, 4, 5, 6]},
    )


def ledger_engine(ledger: Ledger, store: Any) -> Engine:
    class Runner(DictToolRunner):
        def is_idempotent(self, name: str) -> bool:
            return True  # the ledger applies a key once

    return Engine(
        EngineConfig(max_in_flight=3),
        tools=Runner({"effect": ledger.effect}),
        agent="tactical",
        store=store,
    )


@pytest.mark.parametrize("seed", range(16))
async def test_a_crash_anywhere_in_maps_and_loops_then_resume_applies_each_effect_once(
    seed: int, tmp_path: Path
) -> None:
    plan = dynamic_plan(seed)
    validate_plan(plan, tools={"effect"})
    reference_ledger = Ledger()
    reference = await ledger_engine(reference_ledger, None).run(plan)
    assert reference.status is PlanStatus.SUCCEEDED, reference.failures

    rng = random.Random(seed)
    ledger = Ledger()
    path = tmp_path / "state.db"
    store = SqliteStateStore(path)
    task = asyncio.create_task(ledger_engine(ledger, store).run(plan))
    crash_at = rng.randrange(1, max(2, reference_ledger.calls))
    while ledger.calls < crash_at and not task.done():  # noqa: ASYNC110 - counting loop turns
        await asyncio.sleep(0)
    for _ in range(rng.randrange(0, 6)):
        await asyncio.sleep(0)
    task.cancel()  # the process dies here: nothing more is recorded
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await store.aclose()

    async with SqliteStateStore(path) as fresh:
        result = await ledger_engine(ledger, fresh).resume(plan.id)
        report = await replay(fresh, plan.id)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.statuses == reference.statuses
    assert result.outputs == reference.outputs
    # Every effect the uninterrupted run made was applied, each exactly once.
    assert set(ledger.applied) == set(reference_ledger.applied)
    assert set(ledger.applied.values()) == {1}
    assert not report.diverged, report.divergences


async def test_a_map_of_a_tool_that_needs_an_approval_per_call_does_not_run_it() -> None:
    runner = tools()
    engine = Engine(
        tools=runner, agent="tactical", approvals=[ToolApproval(tool="double", when=None)]
    )
    result = await engine.run(plan_of(mapping(), inputs={"ns": [1, 2]}))
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.failure_class.value == "policy"
    assert "needs an approval per call" in failure.message
    assert runner.calls == []  # fail closed: no item ran unasked


async def test_a_fork_refuses_an_output_that_does_not_fit_a_cross_agent_steps_response() -> None:
    dispatcher = InMemoryDispatcher()

    async def analyze(request: WireModel) -> WireModel:
        return AnalyzeNarrativeResponse(protagonist="mira", tension=0.5)

    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    store = InMemoryStateStore()
    eng = Engine(tools=tools(), dispatcher=dispatcher, agent="tactical", store=store)
    ask = {
        "kind": "cross_agent",
        "id": "ask",
        "target": "strategic",
        "capability": "AnalyzeNarrative",
        "request": {"text": "Mira waits."},
    }
    assert (await eng.run(plan_of(ask))).status is PlanStatus.SUCCEEDED
    with pytest.raises(ForkError) as refused:  # before: taken, to fail whoever read it later
        await eng.fork("p", "p2", outputs={"ask": {"tension": "high"}}, author="ann")
    assert refused.value.field == "set.ask"
    assert refused.value.reason.startswith(
        "the output does not fit step 'ask''s output: tension: Input should be a valid number"
    )
    assert await store.load("p2") is None
    await eng.fork("p", "p3", outputs={"ask": {"protagonist": "tomas"}}, author="ann")
