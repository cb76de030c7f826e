"""Tracing overhead: engine per-step cost and request latency with tracing on beside tracing off.

Tracing on is what a deployment exporting to a backend runs (``setup_telemetry``): an SDK
``TracerProvider`` with the span identity sampler and a ``BatchSpanProcessor`` (the SDK's defaults,
or the ``OTEL_BSP_*`` variables) whose OTLP gRPC exporter sends to the running Phoenix
(``make otel-backend``, or one this benchmark starts with ``scripts/otel_backend.sh``). Tracing off
is the OpenTelemetry API's no-op tracer (no provider set up). Both variants run in one process and
one event loop, in alternating order on every repeat:

* **engine**: the layered no-op plan of ``tests.bench.engine``; per-step cost = wall time / steps.
* **request**: one ``ExtractEntities`` call from an ``AgentClient`` to an ``AgentServer`` on
  127.0.0.1 (a fake backend answering at once): the client span, the W3C context in the metadata,
  the server span. Latency per call, median and p99 over the repeats.

After each timed run with tracing on, the provider is flushed, untimed: the export that the batch
processor's thread had not done yet by the end of the run then neither spills into the next
(tracing off) run nor overflows the queue (no span is dropped: ``spans`` counts what the exporter
sent and what it failed to). The flush's wall time per step or call is reported as ``export``: the
cost of encoding and sending spans off the request path (in a background thread, but in the same
process, and it waits for the backend's answer, so it includes the backend's own time).

The targets: tracing adds under 15% to the median request latency (issue 5), and the traced engine
costs at most 2x the untraced one per step (issue 15).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from stratagem.planning import Engine, EngineConfig, PlanStatus
from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ClientConfig,
    ExtractEntitiesRequest,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
)
from stratagem.runtime.telemetry._telemetry import SpanIdentitySampler
from tests.bench.engine import EngineBenchConfig, NoopTools, layered_plan
from tests.bench.stats import summarize
from tests.unit.protocol._support import FakeBackend

__all__ = ["TARGET_ADDED", "run_tracing_benchmark"]

TARGET_ADDED: Final = {"engine": 1.0, "request": 0.15}
"""What tracing may add, per measure: the engine at most 2x its untraced cost per step (issue 15's
target, OTLP through a batching exporter), a request under 15% of its latency."""

OFF: Final = "tracing_off"
ON: Final = "tracing_on_otlp"


class _Counting(SpanExporter):
    """Counts the spans its exporter sent and those it failed to send."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.sent = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.sent += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _Traced:
    """Tracing on: the provider ``setup_telemetry`` makes, exporting over OTLP gRPC."""

    def __init__(self, otlp_endpoint: str, service: str) -> None:
        self.exporter = _Counting(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True))
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service}),
            sampler=SpanIdentitySampler(service, f"{service}-bench"),
        )
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.flushes: list[float] = []
        """Wall time of each flush after a run, seconds."""

    def flush(self) -> None:
        started = time.perf_counter()
        self.provider.force_flush()
        self.flushes.append(time.perf_counter() - started)

    def spans(self) -> dict[str, int]:
        return {"exported": self.exporter.sent, "failed": self.exporter.failed}


async def _alternate(
    runs: dict[str, Callable[[], Awaitable[float]]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            await runs[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % 2 :] + names[: repeat % 2]:
            samples[name].append(await runs[name]())
    return samples


_Samples = tuple[dict[str, list[float]], dict[str, list[float]], list[float], dict[str, int]]
"""Per-variant wall time and CPU time per step or call, the export (flush) time after each traced
run, the exporter's counts."""


async def _engine(otlp_endpoint: str, config: EngineBenchConfig) -> _Samples:
    plan = layered_plan(config)
    tools = NoopTools()
    engine_config = EngineConfig(max_in_flight=config.max_in_flight)
    traced = _Traced(otlp_endpoint, "stratagem-bench-engine")
    engines = {
        OFF: Engine(engine_config, tools=tools, agent="b", tracer_provider=NoOpTracerProvider()),
        ON: Engine(engine_config, tools=tools, agent="b", tracer_provider=traced.provider),
    }

    cpu: dict[str, list[float]] = {name: [] for name in engines}

    def timed(name: str, engine: Engine) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            gc.collect()
            started, started_cpu = time.perf_counter(), time.thread_time()
            result = await engine.run(plan)
            wall = time.perf_counter() - started
            cpu[name].append((time.thread_time() - started_cpu) / config.steps)
            if result.status is not PlanStatus.SUCCEEDED:
                raise RuntimeError(f"the engine run ended {result.status}")
            if name == ON:
                traced.flush()
            return wall / config.steps

        return run

    try:
        samples = await _alternate(
            {name: timed(name, engine) for name, engine in engines.items()},
            config.repeats,
            config.warmup,
        )
    finally:
        traced.provider.shutdown()
    export = [flush / config.steps for flush in traced.flushes[-config.repeats :]]
    cpu = {name: values[-config.repeats :] for name, values in cpu.items()}
    return samples, cpu, export, traced.spans()


async def _requests(otlp_endpoint: str, calls: int, repeats: int) -> _Samples:
    request = ExtractEntitiesRequest(text="Mira waits in the hall.")
    traced = _Traced(otlp_endpoint, "stratagem-bench-rpc")
    providers = {OFF: NoOpTracerProvider(), ON: traced.provider}
    cpu: dict[str, list[float]] = {name: [] for name in providers}
    servers: dict[str, AgentServer] = {}
    clients: dict[str, AgentClient] = {}
    try:
        for name, provider in providers.items():
            server = AgentServer(
                FakeBackend("perception"),
                policy=Policy.default(),
                authenticator=CallerMetadataAuthenticator(),
                audit=InMemoryAuditLog(),
                config=ServerConfig(host="127.0.0.1", port=0),
                tracer_provider=provider,
            )
            await server.start()
            servers[name] = server
            clients[name] = AgentClient(
                server.endpoint,
                caller="operator",
                config=ClientConfig(default_timeout_s=10),
                tracer_provider=provider,
            )

        def timed(name: str, client: AgentClient) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                started, started_cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    await client.call("perception", "ExtractEntities", request)
                wall = time.perf_counter() - started
                cpu[name].append((time.process_time() - started_cpu) / calls)
                if name == ON:
                    traced.flush()
                return wall / calls

            return run

        samples = await _alternate(
            {name: timed(name, client) for name, client in clients.items()}, repeats, warmup=3
        )
    finally:
        for client in clients.values():
            await client.aclose()
        for server in servers.values():
            await server.aclose()
        traced.provider.shutdown()
    export = [flush / calls for flush in traced.flushes[-repeats:]]
    cpu = {name: values[-repeats:] for name, values in cpu.items()}
    return samples, cpu, export, traced.spans()


def _compare(measured: _Samples, max_added: float) -> dict[str, Any]:
    samples, cpu, export, spans = measured
    off, on = statistics.median(samples[OFF]), statistics.median(samples[ON])
    added = on / off - 1
    cpu_off, cpu_on = statistics.median(cpu[OFF]), statistics.median(cpu[ON])
    return {
        "variants": {name: summarize(values, scale=1e6) for name, values in samples.items()},
        "ratio": round(on / off, 3),
        "added": round(added, 3),
        "met": added <= max_added,
        "cpu": {name: summarize(values, scale=1e6) for name, values in cpu.items()},
        "cpu_ratio": round(cpu_on / cpu_off, 3),
        "export": summarize(export, scale=1e6),
        "spans": spans,
    }


def run_tracing_benchmark(
    otlp_endpoint: str,
    *,
    engine: EngineBenchConfig | None = None,
    calls: int = 200,
    repeats: int = 15,
) -> dict[str, Any]:
    """Measure tracing on (OTLP to ``otlp_endpoint``) beside tracing off.

    Returns:
        A JSON-ready dict: ``backend`` (the OTLP endpoint), ``engine`` and ``request`` (each with
        ``variants``: per-step or per-call microseconds summarized over the repeats, ``ratio`` of
        the medians on/off, ``added`` = ratio - 1, ``met``; ``cpu`` and ``cpu_ratio``: the same
        for CPU time, of the event loop's thread for the engine and of the process for requests
        (less disturbed by other processes on the machine than wall time); ``export``: the untimed
        flush after each traced run, microseconds per step or call; ``spans``: how many the
        exporter sent and failed to send) and ``target`` (``max_added``, per measure).
    """
    engine = engine or EngineBenchConfig(layers=10, width=50, repeats=repeats)
    engine_samples = asyncio.run(_engine(otlp_endpoint, engine))
    request_samples = asyncio.run(_requests(otlp_endpoint, calls, repeats))
    return {
        "backend": otlp_endpoint,
        "engine": {"steps": engine.steps, **_compare(engine_samples, TARGET_ADDED["engine"])},
        "request": {
            "calls_per_repeat": calls,
            **_compare(request_samples, TARGET_ADDED["request"]),
        },
        "target": {"max_added": TARGET_ADDED},
    }
