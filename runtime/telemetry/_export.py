"""Span export to an OTLP backend that never holds up a request.

Every process (the CLI and each agent) exports through one ``BackendSpanExporter`` behind a
``BatchSpanProcessor``: spans are queued as they end and sent from the processor's own thread, so a
request never waits on the backend. The exporter finds its backend, and stays bounded when there
is none or it stops answering:

* **Where.** An OTLP endpoint configured by the standard ``OTEL_*`` variables is used as given.
  Otherwise the backend is the one ``scripts/otel_backend.sh`` records in
  ``STATE_DIR/otel-backend/backend.json`` (``make otel-backend``'s Phoenix), looked up again every
  ``refresh_s``: agents deployed before the backend started find it without a restart, and follow
  it to another port.
* **Whether.** Before sending, the endpoint's TCP port is probed (at most every ``refresh_s``, a
  ``probe_timeout_s`` connect): a backend that is not listening costs nothing, its spans are
  dropped and counted as ``skipped``.
* **How long.** One export lasts at most ``timeout_s`` (the OTLP exporter's own deadline, retries
  included; ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` when set). An export that fails (a backend that
  accepts connections but does not answer, or stopped mid-send) opens a breaker: nothing is sent
  for ``cooldown_s``, then the probe decides again. Each failed export is counted as ``failed``:
  the number of times this process's export thread was held by a backend that did not answer.

``BatchSpanProcessor.force_flush`` ignores its timeout and waits for the export in progress: a
flush that must not hold up its caller (``stratagem submit`` asks every agent for one) waits for it
at most ``runtime.telemetry._telemetry.FLUSH_WAIT_S`` (``flush_spans``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["BackendSpanExporter", "ExportStats", "Target", "configured_target", "recorded_target"]

logger = logging.getLogger(__name__)

# The OTLP exporters log every failed attempt at WARNING/ERROR (with the CLI's root logger at
# ERROR, on the user's terminal); this module says once per outage what happened instead.
_QUIET = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)

DEFAULT_TIMEOUT_S = 5.0
"""How long one export may take (retries included) unless ``OTEL_*_TIMEOUT`` says otherwise."""


@dataclass(frozen=True, slots=True)
class Target:
    """An OTLP endpoint to send spans to.

    Attributes:
        endpoint: The endpoint as the OTLP exporter takes it (``http://127.0.0.1:4317``); empty
            when the exporter reads it from the ``OTEL_*`` variables itself.
        protocol: ``grpc`` or ``http/protobuf``.
        probe: ``(host, port)`` whose TCP port tells whether anything listens (``None``: send
            without probing).
    """

    endpoint: str
    protocol: str
    probe: tuple[str, int] | None


@dataclass(frozen=True, slots=True)
class ExportStats:
    """What a process's exporter did with the spans it was given.

    Attributes:
        exported: Spans the backend took.
        skipped: Spans dropped without trying: no backend was listening, or the breaker was open.
        failed: Exports that were sent and failed (each held the export thread at most the
            exporter's timeout).
        endpoint: The endpoint used last (empty: none yet).
    """

    exported: int = 0
    skipped: int = 0
    failed: int = 0
    endpoint: str = ""


def _host_port(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of an OTLP endpoint that names its port (``http://h:p``, ``h:p``), else
    ``None`` (the exporter's own default then applies, and nothing is probed)."""
    parsed = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def _over_http() -> bool:
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    )
    return protocol.startswith("http")


def configured_target() -> Target | None:
    """The OTLP endpoint the ``OTEL_*`` variables configure for traces, if any."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
    if not endpoint and "otlp" not in exporters:
        return None
    http = _over_http()
    # The specification's defaults when only OTEL_TRACES_EXPORTER=otlp is set.
    probe = _host_port(endpoint) if endpoint else ("localhost", 4318 if http else 4317)
    # The exporter reads the variables itself (with their signal-specific paths and headers).
    return Target(endpoint="", protocol="http/protobuf" if http else "grpc", probe=probe)


def recorded_target(state_dir: Path) -> Target | None:
    """The backend ``scripts/otel_backend.sh`` recorded under ``state_dir``, if its file is there
    (whether it listens is the probe's to say)."""
    from stratagem.runtime.telemetry._backend_state import read_backend_state

    state = read_backend_state(state_dir)
    if state is None:
        return None
    return Target(
        endpoint=state.otlp_endpoint,
        protocol=state.otlp_protocol,
        probe=_host_port(state.otlp_endpoint),
    )


def _timeout_s() -> float:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        value = os.environ.get(name)
        if value:
            try:
                return max(0.1, float(value))
            except ValueError:
                logger.warning(
                    "%s=%r is not a number of seconds; using %s", name, value, DEFAULT_TIMEOUT_S
                )
    return DEFAULT_TIMEOUT_S


def _otlp_exporter(target: Target, timeout_s: float) -> SpanExporter:
    """The OTLP exporter for ``target`` (its endpoint, or the ``OTEL_*`` variables' when empty)."""
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    endpoint = target.endpoint or None
    if target.protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return HttpExporter(endpoint=endpoint, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    insecure = None if endpoint is None else endpoint.startswith("http://")
    return GrpcExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s)


def _listening(address: tuple[str, int], timeout_s: float) -> bool:
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except OSError:
        return False


class BackendSpanExporter(SpanExporter):
    """Sends spans to the OTLP backend ``find_target`` names, never for longer than its bounds
    (see the module docstring).

    Args:
        find_target: Where to send spans now (``None``: nowhere); asked at most every
            ``refresh_s``. ``configured_target`` or ``recorded_target(state_dir)``.
        timeout_s: The longest one export may take (``None``: ``OTEL_*_TIMEOUT``, else 5 s).
        refresh_s: How often the target is looked up and probed again.
        probe_timeout_s: How long the probe's TCP connect may take.
        cooldown_s: How long nothing is sent after an export failed.
        make_exporter: Builds the OTLP exporter for a target (tests give another).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        find_target: Callable[[], Target | None],
        *,
        timeout_s: float | None = None,
        refresh_s: float = 2.0,
        probe_timeout_s: float = 0.25,
        cooldown_s: float = 10.0,
        make_exporter: Callable[[Target, float], SpanExporter] = _otlp_exporter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._find_target = find_target
        self._timeout_s = _timeout_s() if timeout_s is None else timeout_s
        self._refresh_s = refresh_s
        self._probe_timeout_s = probe_timeout_s
        self._cooldown_s = cooldown_s
        self._make_exporter = make_exporter
        self._clock = clock
        self._lock = threading.Lock()  # the processor's thread exports; a flush may too
        self._target: Target | None = None
        self._inner: SpanExporter | None = None
        self._listening = False
        self._checked_at = float("-inf")
        self._closed_until = float("-inf")
        self._outage = False
        self._stats = ExportStats()

    @property
    def stats(self) -> ExportStats:
        """What was exported, skipped and failed so far."""
        return self._stats

    def _count(self, *, exported: int = 0, skipped: int = 0, failed: int = 0) -> None:
        now = self._stats
        self._stats = dataclasses.replace(
            now,
            exported=now.exported + exported,
            skipped=now.skipped + skipped,
            failed=now.failed + failed,
        )

    def _ready(self, now: float) -> SpanExporter | None:
        """The exporter to send with now, or ``None`` (no backend, not listening, cooling down)."""
        if now < self._closed_until:
            return None
        if now - self._checked_at >= self._refresh_s:
            self._checked_at = now
            try:
                target = self._find_target()
            except Exception:  # a backend record being rewritten: look again next time
                logger.debug("cannot look up the trace backend", exc_info=True)
                target = self._target
            if target != self._target:
                self._replace(target)
            self._listening = target is not None and (
                target.probe is None or _listening(target.probe, self._probe_timeout_s)
            )
            if self._listening and self._outage:
                logger.warning("trace backend at %s answers again", self._stats.endpoint)
                self._outage = False
        return self._inner if self._listening else None

    def _replace(self, target: Target | None) -> None:
        old, self._inner, self._target = self._inner, None, target
        if old is not None:
            old.shutdown()
        if target is not None:
            self._inner = self._make_exporter(target, self._timeout_s)
            where = target.endpoint or "OTEL_EXPORTER_OTLP_*"
            self._stats = dataclasses.replace(self._stats, endpoint=where)
            logger.info("exporting spans to %s", self._stats.endpoint)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            inner = self._ready(self._clock())
            if inner is None:
                self._count(skipped=len(spans))
                return SpanExportResult.FAILURE
            try:
                result = inner.export(spans)
            except Exception:  # an exporter bug must not end the processor's thread
                logger.debug("the OTLP exporter raised", exc_info=True)
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                self._count(exported=len(spans))
                return result
            self._count(failed=1, skipped=len(spans))
            self._closed_until = self._clock() + self._cooldown_s
            self._checked_at = float("-inf")  # probe again once the breaker closes
            if not self._outage:
                logger.warning(
                    "trace backend at %s did not take %d spans; not sending for %.0f s",
                    self._stats.endpoint,
                    len(spans),
                    self._cooldown_s,
                )
                self._outage = True
            return result

    def shutdown(self) -> None:
        with self._lock:
            self._replace(None)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
