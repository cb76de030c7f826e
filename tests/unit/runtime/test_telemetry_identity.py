"""``SpanIdentitySampler``: every recorded span carries its process's identity as attributes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import Link, SpanKind

from stratagem.planning import Engine, PlanStatus
from stratagem.runtime.telemetry._telemetry import (
    INSTANCE_ATTR,
    KIND_ATTR,
    LINKS_ATTR,
    SERVICE_ATTR,
    SpanIdentitySampler,
)
from tests.unit.planning._support import DictToolRunner, make_plan, noop, tool_step


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider(sampler=SpanIdentitySampler("stratagem-test", "test-1"))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def test_every_kind_gets_service_instance_and_kind_beside_its_own_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")
    for kind in SpanKind:
        with tracer.start_as_current_span(kind.name, kind=kind, attributes={"own": kind.value}):
            pass
    spans = exporter.get_finished_spans()
    assert len(spans) == len(SpanKind)
    for span in spans:
        assert dict(span.attributes or {}) == {
            "own": SpanKind[span.name].value,
            SERVICE_ATTR: "stratagem-test",
            INSTANCE_ATTR: "test-1",
            KIND_ATTR: span.name,
        }
        assert span.kind is SpanKind[span.name]


def test_links_are_an_attribute_too(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("first") as first:
        pass
    with tracer.start_as_current_span("second") as second:
        pass
    links = [Link(first.get_span_context()), Link(second.get_span_context())]
    with tracer.start_as_current_span("linked", links=links):
        pass
    linked = exporter.get_finished_spans()[-1]
    expected = [
        f"{ctx.trace_id:032x}-{ctx.span_id:016x}"
        for ctx in (first.get_span_context(), second.get_span_context())
    ]
    assert list((linked.attributes or {})[LINKS_ATTR]) == expected
    assert [link.context for link in linked.links] == [link.context for link in links]
    assert LINKS_ATTR not in (exporter.get_finished_spans()[0].attributes or {})


def test_the_delegate_decides_and_nothing_dropped_is_stamped(
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider(
        sampler=SpanIdentitySampler("stratagem-test", "test-1", ParentBased(ALWAYS_OFF))
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with provider.get_tracer("test").start_as_current_span("dropped") as span:
            assert not span.is_recording()
    finally:
        provider.shutdown()
    assert exporter.get_finished_spans() == ()


async def test_the_engine_spans_carry_the_identity(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = Engine(
        tools=DictToolRunner({"noop": noop}), agent="tactical", tracer_provider=provider
    )
    result = await engine.run(make_plan(tool_step("a"), tool_step("b", "a"), owner="tactical"))
    assert result.status is PlanStatus.SUCCEEDED
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "invoke_agent tactical",
        "step a",
        "step b",
    ]
    for span in spans:
        attributes = span.attributes or {}
        assert attributes[SERVICE_ATTR] == "stratagem-test"
        assert attributes[KIND_ATTR] == "INTERNAL"
    (step_a,) = [s for s in spans if s.name == "step a"]
    assert dict(step_a.attributes or {}) == {
        "stratagem.plan.id": result.submitted.id,
        "stratagem.step.id": "a",
        "stratagem.step.kind": "tool",
        "stratagem.step.attempt": 1,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "noop",
        "gen_ai.tool.call.id": f"{result.submitted.id}@1:a",
        SERVICE_ATTR: "stratagem-test",
        INSTANCE_ATTR: "test-1",
        KIND_ATTR: "INTERNAL",
    }
