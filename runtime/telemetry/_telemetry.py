"""Telemetry: one TracerProvider per process, exporters from the standard ``OTEL_*`` variables.

Each process (the CLI's driver and every agent actor) calls ``setup_telemetry`` once. Spans go, in
batches, to:

* a JSON-lines file (``STRATAGEM_TRACE_FILE``) that every process appends to, which the CLI reads to
  print a goal's span tree without any backend;
* an OTLP backend (``runtime.telemetry._export``): the endpoint ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` names (or ``OTEL_TRACES_EXPORTER=otlp``; protocol from
  ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc``, the default, or ``http/protobuf``), else the one
  ``make otel-backend`` records in the state directory, whenever it runs. The export is bounded and
  never holds up a request. ``OTEL_TRACES_EXPORTER=none`` turns it off, ``OTEL_SDK_DISABLED=true``
  turns tracing off.

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
from collections.abc import Callable, Iterable, Sequence
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

from stratagem.runtime.config._statedir import open_private

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter

    from stratagem.runtime.telemetry._export import BackendSpanExporter, ExportStats

__all__ = [
    "JsonLinesSpanExporter",
    "SpanIdentitySampler",
    "SpanRecord",
    "export_stats",
    "flush_spans",
    "read_spans",
    "setup_telemetry",
    "shutdown_telemetry",
]

logger = logging.getLogger(__name__)

VERSION = "0.1.0"
_lock = threading.Lock()
_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None
_exporter: BackendSpanExporter | None = None
_file_processor: BatchSpanProcessor | None = None
_backend_processor: BatchSpanProcessor | None = None
_owner = ""  # the service the provider was made for

FLUSH_WAIT_S = 1.0
"""How long a flush waits for the backend export (the span file is always written first): the
SDK's ``force_flush`` ignores its timeout and waits for the export in progress, so a flush that
must not hold up its caller runs it on a thread of its own and waits this long."""

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
    state_dir: Path | None = None,
    instance_id: str | None = None,
    extra_resource: dict[str, str] | None = None,
) -> TracerProvider:
    """Create this process's TracerProvider and make it the global one (once per process).

    Args:
        service: ``service.name``, e.g. ``stratagem-perception`` or ``stratagem-cli``.
        trace_file: JSON-lines span file to append to, if any.
        state_dir: Where ``make otel-backend`` records its backend: spans go there whenever it
            runs, unless the ``OTEL_*`` variables name an endpoint (``None``: only those).
        instance_id: ``service.instance.id``; defaults to the process id.
        extra_resource: More resource attributes (e.g. the Ray node id).

    Returns:
        The provider; later calls in the same process return the first one.

    With metrics exported (see the module docstring) it also makes this process's
    ``MeterProvider``, with the same resource, and makes it the global one.
    """
    global _provider, _meter_provider, _exporter, _owner, _file_processor, _backend_processor
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
            # The file first: a flush (sequential over processors) writes it before it waits on
            # a backend.
            if trace_file is not None:
                _file_processor = BatchSpanProcessor(
                    JsonLinesSpanExporter(trace_file), schedule_delay_millis=500
                )
                provider.add_span_processor(_file_processor)
            _exporter = _backend_exporter(state_dir)
            if _exporter is not None:
                _backend_processor = BatchSpanProcessor(_exporter)
                provider.add_span_processor(_backend_processor)
        trace.set_tracer_provider(provider)
        _provider, _owner = provider, service
        return provider


def _backend_exporter(state_dir: Path | None) -> BackendSpanExporter | None:
    """The OTLP exporter the ``OTEL_*`` variables configure, else one that follows the backend
    recorded in ``state_dir``; ``None`` when trace export is off or there is nowhere to look."""
    if "none" in os.environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        return None
    from stratagem.runtime.telemetry._export import (
        BackendSpanExporter,
        configured_target,
        recorded_target,
    )

    configured = configured_target()
    if configured is not None:
        return BackendSpanExporter(lambda: configured)
    if state_dir is None:
        return None
    return BackendSpanExporter(lambda: recorded_target(state_dir))


def export_stats() -> ExportStats | None:
    """What this process's OTLP exporter did so far (``None``: it has none)."""
    exporter = _exporter
    return None if exporter is None else exporter.stats


def _bounded(call: Callable[[], object], timeout_s: float, name: str) -> bool:
    """Run ``call`` on a thread of its own; whether it ended within ``timeout_s`` (if not, it goes
    on in the background: a daemon thread, which the interpreter's exit does not wait for)."""
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception:
            logger.warning("%s failed", name, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=f"stratagem-{name}", daemon=True).start()
    return done.wait(timeout_s)


def flush_spans(timeout_s: float = FLUSH_WAIT_S) -> bool:
    """Write this process's finished spans to the span file now, and give their export to the
    backend up to ``timeout_s`` (it goes on after that); whether everything was flushed.

    A provider made elsewhere (a program's own) is flushed as the SDK does, with the same bound.
    """
    with _lock:
        provider, to_file, to_backend = _provider, _file_processor, _backend_processor
    if provider is None:
        current = trace.get_tracer_provider()
        if not isinstance(current, TracerProvider):
            return True
        return _bounded(current.force_flush, timeout_s, "span-flush")
    if to_file is not None:
        to_file.force_flush()
    if to_backend is None:
        return True
    return _bounded(to_backend.force_flush, timeout_s, "span-flush")


def shutdown_telemetry(service: str | None = None) -> None:
    """Flush every pending span and close the exporters of this process's provider (waiting for
    a backend at most ``FLUSH_WAIT_S`` each time: see ``flush_spans``).

    Args:
        service: The service that asks (``stratagem-cli``): when the provider was made for
            another one (a program or test that runs the CLI in its own process), its spans are
            flushed and the provider is left running for its owner.
    """
    global _provider, _meter_provider, _exporter, _file_processor, _backend_processor
    with _lock:
        owned_elsewhere = service is not None and _provider is not None and _owner != service
    if owned_elsewhere:
        flush_spans()
        return
    flushed = flush_spans()
    with _lock:
        provider, _provider = _provider, None
        meter_provider, _meter_provider = _meter_provider, None
        _exporter = _file_processor = _backend_processor = None
    if provider is not None:
        # A backend that held the flush up would hold the shutdown up too: not waited for twice.
        _bounded(provider.shutdown, FLUSH_WAIT_S if flushed else 0.0, "telemetry-shutdown")
    if meter_provider is not None:
        meter_provider.shutdown(timeout_millis=5_000)
