"""Spans: plan run, step attempts, tool calls and the cross-agent call, with their attributes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from planning import Engine, EngineConfig, InMemoryDispatcher, ToolContext, TransientError
from protocol import AnalyzeNarrativeResponse, WireModel

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
    assert sorted(spans) == [
        "client call",
        "execute_tool read",
        "invoke_agent perception",
        "step analyze",
        "step read",
    ]
    (run,) = spans["invoke_agent perception"]
    (step_read,) = spans["step read"]
    (step_analyze,) = spans["step analyze"]
    (tool,) = spans["execute_tool read"]
    (client,) = spans["client call"]
    assert parent_of(run) is None
    assert parent_of(step_read) == span_id(run)
    assert parent_of(step_analyze) == span_id(run)
    assert parent_of(tool) == span_id(step_read)
    assert parent_of(client) == span_id(step_analyze)
    assert handler_parent == [span_id(step_analyze)]
    assert len({s.context.trace_id for s in exporter.get_finished_spans() if s.context}) == 1
    assert dict(run.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "perception",
        "stratagem.plan.id": "p1",
        "stratagem.plan.revision": 2,
        "stratagem.plan.status": "succeeded",
    }
    assert dict(step_read.attributes or {}) == {
        "stratagem.plan.id": "p1",
        "stratagem.step.id": "read",
        "stratagem.step.kind": "tool",
        "stratagem.step.attempt": 1,
    }
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "read",
        "gen_ai.tool.call.id": "p1@2:read",
    }
    assert step_analyze.attributes is not None
    assert step_analyze.attributes["stratagem.step.kind"] == "cross_agent"
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
    tools = spans["execute_tool flaky"]
    assert len(tools) == 3
    assert all(t.status.status_code is StatusCode.ERROR for t in tools)
    assert [e.name for e in tools[0].events] == ["exception"]
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
