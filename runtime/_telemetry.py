"""Telemetry: one TracerProvider per process, exporters from the standard ``OTEL_*`` variables.

Each process (the CLI's driver and every agent actor) calls ``setup_telemetry`` once. Spans go, in
batches, to:

* an OTLP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
  set or ``OTEL_TRACES_EXPORTER`` names ``otlp`` (protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``:
  ``grpc``, the default, or ``http/protobuf``); ``OTEL_SDK_DISABLED=true`` turns tracing off;
* a JSON-lines file (``STRATAGEM_TRACE_FILE``) that every process appends to, which the CLI reads to
  print a goal's span tree without any backend.

Each process also makes a ``MeterProvider`` when metrics are exported: an OTLP metric exporter when
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set or
``OTEL_METRICS_EXPORTER`` names ``otlp`` (``OTEL_METRICS_EXPORTER=none`` turns it off; interval from
``OTEL_METRIC_EXPORT_INTERVAL``). The planning and protocol instruments use the global provider.

Every span also carries its process's ``service.name`` and ``service.instance.id``, its kind and its
links as ``stratagem.*`` attributes (``SpanIdentitySampler`` puts them among the span's initial
attributes): some backends (Arize Phoenix among them) keep only a span's attributes and drop the
resource, the kind and the links.

``shutdown_telemetry`` flushes and closes the exporters; actors call it when they stop.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes, AttributeValue

from stratagem.runtime._statedir import open_private

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter

__all__ = [
    "JsonLinesSpanExporter",
    "SpanIdentitySampler",
    "SpanRecord",
    "read_spans",
    "setup_telemetry",
    "shutdown_telemetry",
]

logger = logging.getLogger(__name__)

VERSION = "0.1.0"
_lock = threading.Lock()
_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None
_owner = ""  # the service the provider was made for

SERVICE_ATTR = "stratagem.service.name"
INSTANCE_ATTR = "stratagem.service.instance.id"
KIND_ATTR = "stratagem.span.kind"
LINKS_ATTR = "stratagem.links"
"""Span attributes that repeat what backends keeping only attributes drop (see the docstring)."""


class SpanIdentitySampler(Sampler):
    """Samples as its delegate does and gives every span it records the ``stratagem.*`` identity
    attributes: service, instance, kind and links.

    The attributes go into the sampling result, which the SDK makes the span's initial attributes
    in one pass, instead of a span processor setting them one by one after the span started; the
    per-process part is built once. The delegate's decision stands: this sampler drops nothing.

    Args:
        service: ``service.name`` of this process.
        instance_id: ``service.instance.id`` of this process.
        delegate: The sampler that decides; by default the one the SDK takes from
            ``OTEL_TRACES_SAMPLER`` (parent-based, always on, unless configured otherwise).
    """

    def __init__(self, service: str, instance_id: str, delegate: Sampler | None = None) -> None:
        self._delegate = delegate or _configured_sampler()
        self._identity = {
            kind: {SERVICE_ATTR: service, INSTANCE_ATTR: instance_id, KIND_ATTR: kind.name}
            for kind in SpanKind
        }

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        result = self._delegate.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )
        if result.decision is Decision.DROP:
            return result
        merged: dict[str, AttributeValue] = {**result.attributes}
        merged.update(self._identity[kind or SpanKind.INTERNAL])
        if links:
            merged[LINKS_ATTR] = [
                f"{link.context.trace_id:032x}-{link.context.span_id:016x}" for link in links
            ]
        return SamplingResult(result.decision, merged, result.trace_state)

    def get_description(self) -> str:
        return f"SpanIdentitySampler{{{self._delegate.get_description()}}}"


def _configured_sampler() -> Sampler:
    """The sampler the SDK configures from ``OTEL_TRACES_SAMPLER`` (and its argument)."""
    return TracerProvider(shutdown_on_exit=False).sampler


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object a line.

    Each batch is written with a single ``write`` on a file opened in append mode, so several
    processes can share one file on a local filesystem without interleaving lines.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(
            json.dumps(_span_to_dict(span), separators=(",", ":")) + "\n" for span in spans
        )
        try:
            fd = open_private(self._path)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        except OSError:
            logger.warning("could not append spans to %s", self._path, exc_info=True)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release: every export opens and closes the file."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{parent.span_id:016x}" if parent else "",
        "name": span.name,
        "kind": span.kind.name,
        "start": span.start_time or 0,
        "end": span.end_time or 0,
        "status": span.status.status_code.name,
        "service": str(span.resource.attributes.get("service.name", "")),
        "pid": os.getpid(),
        "attributes": {key: _jsonable(value) for key, value in (span.attributes or {}).items()},
        "events": [
            {
                "name": event.name,
                "time": event.timestamp,
                "attributes": {k: _jsonable(v) for k, v in (event.attributes or {}).items()},
            }
            for event in span.events
        ],
    }


def _jsonable(value: object) -> object:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Iterable):
        return [_jsonable(item) for item in value]
    return str(value)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """A finished span as read back from a JSON-lines span file."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start: int
    end: int
    status: str
    service: str
    pid: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    """Span events: ``name``, ``time`` (ns since the epoch) and ``attributes`` each."""

    @property
    def duration_ms(self) -> float:
        """Wall time of the span in milliseconds."""
        return (self.end - self.start) / 1e6


def read_spans(path: Path, trace_id: str | None = None) -> list[SpanRecord]:
    """Spans from a JSON-lines file, optionally of one trace, in start order.

    A line cut short by a process that died mid-write is skipped.
    """
    if not path.exists():
        return []
    records: list[SpanRecord] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            raw = json.loads(line)
            record = SpanRecord(**raw)
        except (ValueError, TypeError):
            continue
        if trace_id is None or record.trace_id == trace_id:
            records.append(record)
    records.sort(key=lambda r: r.start)
    return records


def _otlp_wanted(signal: str) -> bool:
    """Whether the ``OTEL_*`` variables ask for OTLP export of ``signal`` (TRACES or METRICS)."""
    exporters = os.environ.get(f"OTEL_{signal}_EXPORTER", "").split(",")
    if "none" in exporters:
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        or "otlp" in exporters
    )


def _otlp_over_http(signal: str) -> bool:
    """Whether ``signal`` goes over OTLP/HTTP (else gRPC, the default)."""
    protocol = os.environ.get(
        f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    )
    return protocol.startswith("http")


def _otlp_exporter() -> SpanExporter:
    if _otlp_over_http("TRACES"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    return GrpcExporter()


def _otlp_metric_exporter() -> MetricExporter:
    if _otlp_over_http("METRICS"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpExporter,
        )

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcExporter,
    )

    return GrpcExporter()


def setup_telemetry(
    service: str,
    *,
    trace_file: Path | None = None,
    instance_id: str | None = None,
    extra_resource: dict[str, str] | None = None,
) -> TracerProvider:
    """Create this process's TracerProvider and make it the global one (once per process).

    Args:
        service: ``service.name``, e.g. ``stratagem-perception`` or ``stratagem-cli``.
        trace_file: JSON-lines span file to append to, if any.
        instance_id: ``service.instance.id``; defaults to the process id.
        extra_resource: More resource attributes (e.g. the Ray node id).

    Returns:
        The provider; later calls in the same process return the first one.

    With metrics exported (see the module docstring) it also makes this process's
    ``MeterProvider``, with the same resource, and makes it the global one.
    """
    global _provider, _meter_provider, _owner
    with _lock:
        if _provider is not None:
            return _provider
        attributes: dict[str, str] = {
            "service.name": service,
            "service.namespace": "stratagem",
            "service.version": VERSION,
            "service.instance.id": instance_id or f"{service}-{os.getpid()}",
        }
        attributes.update(extra_resource or {})
        resource = Resource.create(attributes)
        disabled = os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true"
        provider = TracerProvider(
            resource=resource,
            sampler=None
            if disabled
            else SpanIdentitySampler(service, attributes["service.instance.id"]),
        )
        if not disabled:
            if _otlp_wanted("METRICS"):
                # The metrics SDK only where metrics are exported (not in every CLI command).
                from opentelemetry.sdk.metrics import MeterProvider
                from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

                reader = PeriodicExportingMetricReader(_otlp_metric_exporter())
                _meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
                metrics.set_meter_provider(_meter_provider)
            if _otlp_wanted("TRACES"):
                provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
            if trace_file is not None:
                provider.add_span_processor(
                    BatchSpanProcessor(JsonLinesSpanExporter(trace_file), schedule_delay_millis=500)
                )
        trace.set_tracer_provider(provider)
        _provider, _owner = provider, service
        return provider


def shutdown_telemetry(service: str | None = None) -> None:
    """Flush every pending span and close the exporters of this process's provider.

    Args:
        service: The service that asks (``stratagem-cli``): when the provider was made for
            another one (a program or test that runs the CLI in its own process), its spans are
            flushed and the provider is left running for its owner.
    """
    global _provider, _meter_provider
    with _lock:
        if service is not None and _provider is not None and _owner != service:
            _provider.force_flush(timeout_millis=5_000)
            return
        provider, _provider = _provider, None
        meter_provider, _meter_provider = _meter_provider, None
    if provider is not None:
        provider.force_flush(timeout_millis=5_000)
        provider.shutdown()
    if meter_provider is not None:
        meter_provider.shutdown(timeout_millis=5_000)
