"""Planning metrics (plans, steps, retries, checkpoint latency) and a resumed plan's span links."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.planning import (
    Engine,
    LogicError,
    PlanStatus,
    SqliteStateStore,
    StepEvent,
    StepStatus,
    ToolContext,
    TransientError,
)

from ._support import FAST_RETRY, DictToolRunner, make_plan, noop, tool_step


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meters(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    found: list[Any] = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def counts(reader: InMemoryMetricReader, name: str, key: str) -> dict[str, int]:
    return {str(p.attributes[key]): int(p.value) for p in points(reader, name)}


async def test_plans_steps_and_retries_are_counted_by_outcome(
    reader: InMemoryMetricReader, meters: MeterProvider
) -> None:
    calls = {"n": 0}

    async def flaky(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] < 3:
            raise TransientError("try again")
        return {}

    async def broken(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise LogicError("no")

    engine = Engine(
        tools=DictToolRunner({"noop": noop, "flaky": flaky, "broken": broken}),
        agent="perception",
        meter_provider=meters,
    )
    ok = await engine.run(
        make_plan(tool_step("a"), tool_step("b", "a", tool="flaky", retry=FAST_RETRY))
    )
    assert ok.status is PlanStatus.SUCCEEDED
    failed = await engine.run(
        make_plan(tool_step("x", tool="broken"), tool_step("y", "x")).model_copy(
            update={"id": "p2"}
        )
    )
    assert failed.status is PlanStatus.FAILED

    assert counts(reader, "stratagem.plan.runs", "stratagem.outcome") == {
        "succeeded": 1,
        "failed": 1,
    }
    assert counts(reader, "stratagem.steps", "stratagem.outcome") == {
        "succeeded": 2,
        "failed": 1,
        "skipped": 1,
    }
    assert counts(reader, "stratagem.step.retries", "stratagem.failure.class") == {"transient": 2}
    agents = {p.attributes["gen_ai.agent.name"] for p in points(reader, "stratagem.steps")}
    assert agents == {"perception"}


async def test_checkpoint_commits_are_timed(
    tmp_path: Path, reader: InMemoryMetricReader, meters: MeterProvider
) -> None:
    async with SqliteStateStore(tmp_path / "s.db", meter_provider=meters) as store:
        engine = Engine(tools=DictToolRunner({"noop": noop}), agent="tactical", store=store)
        result = await engine.run(make_plan(tool_step("a"), tool_step("b", "a")))
    assert result.status is PlanStatus.SUCCEEDED
    (point,) = points(reader, "stratagem.store.commit.duration")
    assert isinstance(point, HistogramDataPoint)
    assert point.attributes == {"stratagem.store": "sqlite"}
    assert point.count >= 3  # running, the intents and results, the final status
    assert 0 < point.sum < 5


async def test_a_resumed_plan_links_to_the_run_it_continues(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    release = asyncio.Event()

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await release.wait()
        return {}

    tools = DictToolRunner({"noop": noop, "slow": slow})
    path = tmp_path / "state.db"
    events: list[StepEvent] = []
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=tools, agent="strategic", store=store, tracer_provider=tracing)
        plan = make_plan(tool_step("a"), tool_step("b", "a", tool="slow"))
        b_running = asyncio.Event()

        def on_event(event: StepEvent) -> None:
            events.append(event)
            if event.step_id == "b" and event.status is StepStatus.RUNNING:
                b_running.set()

        task = asyncio.create_task(engine.run(plan, on_event=on_event))
        await b_running.wait()
        task.cancel()  # the agent goes down mid-plan
        with pytest.raises(asyncio.CancelledError):
            await task
    (original,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent strategic"]
    assert original.links == ()
    exporter.clear()

    release.set()
    async with SqliteStateStore(path) as store:
        state = await store.load(plan.id)
        assert state is not None
        assert original.context is not None
        ctx = original.context
        flags = int(ctx.trace_flags)
        assert state.trace_contexts == [f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{flags:02x}"]
        engine = Engine(tools=tools, agent="strategic", store=store, tracer_provider=tracing)
        # The reconcile gate for the non-idempotent step in flight: approve it to finish.
        blocked = asyncio.Event()

        def on_resumed_event(event: StepEvent) -> None:
            if event.status is PlanStatus.BLOCKED:
                blocked.set()

        resumed = asyncio.create_task(engine.resume(plan.id, on_event=on_resumed_event))
        await blocked.wait()
        await engine.decide(
            plan.id, "b", approve=True, approver="ann", rationale="done", revision=1
        )
        result = await resumed
    assert result.status is PlanStatus.SUCCEEDED
    (again,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent strategic"]
    assert again.context is not None
    assert original.context is not None
    assert again.context.trace_id != original.context.trace_id  # a new trace...
    (link,) = again.links  # ...linked to the original run's plan span
    assert (link.context.trace_id, link.context.span_id) == (
        original.context.trace_id,
        original.context.span_id,
    )
    assert link.attributes == {"stratagem.link.kind": "original"}
    tracing.shutdown()
