"""Spans: plan run, step attempts, tool calls and the cross-agent call, with their attributes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from stratagem.planning import (
    Engine,
    EngineConfig,
    GateStep,
    InMemoryDispatcher,
    LogicError,
    Plan,
    PlanStatus,
    StepEvent,
    ToolContext,
    ToolStep,
    TransientError,
)
from stratagem.protocol import AnalyzeNarrativeResponse, WireModel

from ._support import FAST_RETRY, DictToolRunner, cross_step, make_plan, noop, tool_step


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    value: int = span.context.span_id
    return value


async def test_spans_nest_and_carry_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    handler_parent: list[int] = []

    async def analyze(request: WireModel) -> WireModel:
        # What a gRPC client span would see as its parent.
        with provider.get_tracer("test").start_as_current_span("client call") as span:
            handler_parent.append(span.parent.span_id if span.parent else 0)  # type: ignore[attr-defined]
        return AnalyzeNarrativeResponse(protagonist="mira")

    async def read(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"text": "Mira waits."}

    dispatcher = InMemoryDispatcher()
    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    engine = Engine(
        EngineConfig(),
        tools=DictToolRunner({"read": read}),
        dispatcher=dispatcher,
        agent="perception",
        tracer_provider=provider,
    )
    plan = make_plan(
        tool_step("read", tool="read"),
        cross_step(
            "analyze", "strategic", "AnalyzeNarrative", {"text": {"$ref": "read.text"}}, "read"
        ),
        revision=2,
    )
    await engine.run(plan)
    spans = by_name(exporter.get_finished_spans())
    # A tool step's attempt is its tool call: one span (no execute_tool span of its own).
    assert sorted(spans) == [
        "client call",
        "invoke_agent perception",
        "step analyze",
        "step read",
    ]
    (run,) = spans["invoke_agent perception"]
    (step_read,) = spans["step read"]
    (step_analyze,) = spans["step analyze"]
    (client,) = spans["client call"]
    assert parent_of(run) is None
    assert parent_of(step_read) == span_id(run)
    assert parent_of(step_analyze) == span_id(run)
    assert parent_of(client) == span_id(step_analyze)
    assert handler_parent == [span_id(step_analyze)]
    assert len({s.context.trace_id for s in exporter.get_finished_spans() if s.context}) == 1
    assert dict(run.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "perception",
        "gen_ai.agent.id": "perception",
        "stratagem.plan.id": "p1",
        "stratagem.plan.revision": 2,
        "stratagem.plan.status": "succeeded",
    }
    assert dict(step_read.attributes or {}) == {
        "stratagem.plan.id": "p1",
        "stratagem.step.id": "read",
        "stratagem.step.kind": "tool",
        "stratagem.step.attempt": 1,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "read",
        "gen_ai.tool.call.id": "p1@2:read",
    }
    assert step_analyze.attributes is not None
    assert step_analyze.attributes["stratagem.step.kind"] == "cross_agent"
    assert "gen_ai.operation.name" not in step_analyze.attributes  # not a tool call
    assert run.status.status_code is StatusCode.UNSET
    assert step_read.status.status_code is StatusCode.UNSET


async def test_failed_attempts_mark_their_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def flaky(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise TransientError("down")

    async def nothing(delay: float) -> None:
        return None

    engine = Engine(
        tools=DictToolRunner({"flaky": flaky, "noop": noop}),
        agent="tactical",
        tracer_provider=provider,
        sleep=nothing,
    )
    await engine.run(make_plan(tool_step("a", tool="flaky", retry=FAST_RETRY), owner="tactical"))
    spans = by_name(exporter.get_finished_spans())
    steps = spans["step a"]
    assert [s.attributes["stratagem.step.attempt"] for s in steps if s.attributes] == [1, 2, 3]
    for span in steps:
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "down"
        assert span.attributes is not None
        assert span.attributes["stratagem.failure.class"] == "transient"
    # Each attempt's span is the tool call: the tool's exception is an event on it.
    assert all(s.attributes and s.attributes["gen_ai.tool.name"] == "flaky" for s in steps)
    assert [e.name for e in steps[0].events] == ["exception"]
    (run,) = spans["invoke_agent tactical"]
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "step 'a' failed (transient): down"
    assert run.attributes is not None
    assert run.attributes["stratagem.plan.status"] == "failed"


async def test_the_global_provider_is_used_by_default(exporter: InMemorySpanExporter) -> None:
    # Without an injected provider the engine asks the global one (a no-op unless set up).
    engine = Engine(tools=DictToolRunner({"noop": noop}), agent="perception")
    result = await engine.run(make_plan(tool_step("a")))
    assert result.outputs == {"a": {"step": "a"}}
    assert exporter.get_finished_spans() == ()


def events_of(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, dict(e.attributes or {})) for e in span.events]


async def test_retries_are_events_on_the_plan_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    calls: list[int] = []

    async def flaky(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls.append(ctx.attempt)
        if len(calls) < 3:
            raise TransientError("down")
        return {}

    async def nothing(delay: float) -> None:
        return None

    engine = Engine(
        tools=DictToolRunner({"flaky": flaky}),
        agent="tactical",
        agent_id="tactical-7",
        tracer_provider=provider,
        sleep=nothing,
    )
    result = await engine.run(
        make_plan(tool_step("a", tool="flaky", retry=FAST_RETRY), owner="tactical")
    )
    assert result.status is PlanStatus.SUCCEEDED
    spans = by_name(exporter.get_finished_spans())
    (run,) = spans["invoke_agent tactical"]
    assert run.attributes is not None
    assert run.attributes["gen_ai.agent.id"] == "tactical-7"
    retries = events_of(run)
    assert [name for name, _ in retries] == ["retry", "retry"]
    for attempt, (_, attributes) in enumerate(retries, 1):
        assert attributes["stratagem.step.id"] == "a"
        assert attributes["stratagem.step.attempt"] == attempt
        assert attributes["stratagem.failure.class"] == "transient"
        assert 0 < float(attributes["stratagem.retry.delay_s"]) <= 0.01
    steps = spans["step a"]
    assert [s.status.status_code for s in steps] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
    ]
    assert all(parent_of(s) == span_id(run) for s in steps)


async def test_a_failure_marks_step_and_plan_and_compensation_is_an_event(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def broken(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise LogicError("no such door")

    engine = Engine(
        tools=DictToolRunner({"noop": noop, "undo": noop, "broken": broken}),
        agent="perception",
        tracer_provider=provider,
    )
    plan = Plan(
        id="p2",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="noop", compensate="undo"),
            ToolStep(id="b", tool="broken", depends_on=["a"]),
        ],
    )
    result = await engine.run(plan)
    assert result.status is PlanStatus.FAILED
    spans = by_name(exporter.get_finished_spans())
    (step_b,) = spans["step b"]
    assert step_b.status.status_code is StatusCode.ERROR
    assert step_b.attributes is not None
    assert step_b.attributes["stratagem.failure.class"] == "logic"
    (run,) = spans["invoke_agent perception"]
    assert run.status.status_code is StatusCode.ERROR
    compensations = [attrs for name, attrs in events_of(run) if name == "compensation"]
    assert [c["stratagem.compensation.status"] for c in compensations] == [
        "running",
        "compensated",
    ]
    assert all(c["stratagem.step.id"] == "a" for c in compensations)
    assert all(c["gen_ai.tool.name"] == "undo" for c in compensations)


async def test_gate_waits_are_events_on_the_plan_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = Engine(
        tools=DictToolRunner({"noop": noop}), agent="perception", tracer_provider=provider
    )
    plan = Plan(
        id="p3",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="noop"),
            GateStep(id="g", prompt="go on?", depends_on=["a"]),
            ToolStep(id="b", tool="noop", depends_on=["g"]),
        ],
    )
    events: list[StepEvent] = []
    blocked = asyncio.Event()

    def on_event(event: StepEvent) -> None:
        events.append(event)
        if event.status is PlanStatus.BLOCKED:
            blocked.set()

    task = asyncio.create_task(engine.run(plan, on_event=on_event))
    await asyncio.wait_for(blocked.wait(), 5)
    await engine.decide("p3", "g", approve=True, approver="ann", rationale="fine", revision=1)
    assert (await task).status is PlanStatus.SUCCEEDED
    spans = by_name(exporter.get_finished_spans())
    assert "step g" not in spans  # a gate is decided, never run
    (run,) = spans["invoke_agent perception"]
    gate_events = [(n, a) for n, a in events_of(run) if n.startswith("gate.")]
    assert gate_events == [
        (
            "gate.blocked",
            {"stratagem.step.id": "g", "stratagem.step.attempt": 0, "stratagem.gate.kind": "gate"},
        ),
        (
            "gate.decided",
            {
                "stratagem.step.id": "g",
                "stratagem.gate.kind": "gate",
                "stratagem.gate.decision": "approved",
                "stratagem.gate.approver": "ann",
            },
        ),
    ]
    (step_b,) = spans["step b"]
    assert parent_of(step_b) == span_id(run)
