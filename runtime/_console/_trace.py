"""A trace as the console draws it: the span tree of ``stratagem trace --json`` (``span_json``)
flattened into waterfall rows, read from the trace backend when one runs (Phoenix) and from the
span file otherwise, saying which source answered and why another did not."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._render import span_json
from stratagem.runtime.telemetry._backend import (
    BackendError,
    BackendState,
    PhoenixTraces,
    find_backend,
)
from stratagem.runtime.telemetry._telemetry import SpanRecord, read_spans

__all__ = ["TraceRow", "TraceView", "load_trace", "phoenix_link"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One span of the waterfall: its place in the tree and on the time axis (percent)."""

    depth: int
    name: str
    service: str
    offset_ms: float
    duration_ms: float
    left_pct: float
    width_pct: float
    error: bool
    events: str
    span_id: str


@dataclass(frozen=True, slots=True)
class TraceView:
    """A trace ready to draw.

    Attributes:
        trace_id: The trace.
        rows: Its spans, depth first, children in start order.
        total_ms: From the first span's start to the last one's end.
        source: Where the spans came from (``"phoenix at URL"``, ``"span file PATH"``, ``""``).
        problems: What could not be read, one line each (a backend down, no span file...).
        phoenix_url: A link to the trace in Phoenix when it runs (``""`` otherwise).
    """

    trace_id: str
    rows: list[TraceRow] = field(default_factory=list)
    total_ms: float = 0.0
    source: str = ""
    problems: list[str] = field(default_factory=list)
    phoenix_url: str = ""


def phoenix_link(backend: BackendState, trace_id: str) -> str:
    """Phoenix's page of ``trace_id`` (its redirect from an OpenTelemetry trace id)."""
    return f"{backend.url.rstrip('/')}/redirects/traces/{trace_id}"


def _walk(nodes: Sequence[dict[str, Any]], depth: int) -> Iterator[tuple[int, dict[str, Any]]]:
    for node in nodes:
        yield depth, node
        yield from _walk(node["children"], depth + 1)


def _events(node: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for event in node.get("events") or []:
        name = str(event.get("name", "?"))
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def _rows(spans: Sequence[SpanRecord]) -> tuple[list[TraceRow], float]:
    if not spans:
        return [], 0.0
    total_ms = (max(s.end for s in spans) - min(s.start for s in spans)) / 1e6
    rows: list[TraceRow] = []
    for depth, node in _walk(span_json(spans), 0):
        offset, duration = float(node["offset_ms"]), float(node["duration_ms"])
        left = 100.0 * offset / total_ms if total_ms else 0.0
        width = max(0.3, 100.0 * duration / total_ms) if total_ms else 100.0
        rows.append(
            TraceRow(
                depth=depth,
                name=str(node["name"]),
                service=str(node["service"]),
                offset_ms=offset,
                duration_ms=duration,
                left_pct=min(left, 99.7),
                width_pct=min(width, 100.0 - min(left, 99.7)),
                error=node["status"] == "ERROR",
                events=_events(node),
                span_id=str(node["span_id"]),
            )
        )
    return rows, total_ms


def load_trace(settings: Settings, trace_id: str) -> TraceView:
    """The spans of ``trace_id`` from the running Phoenix, else from the span file (blocking:
    call it from a worker thread)."""
    problems: list[str] = []
    spans: list[SpanRecord] = []
    source = ""
    backend = find_backend(settings.state_dir)
    link = phoenix_link(backend, trace_id) if backend is not None else ""
    if backend is not None:
        try:
            spans = PhoenixTraces(backend.url, project=backend.project, timeout_s=5.0).spans(
                trace_id
            )
            source = f"phoenix at {backend.url}"
        except BackendError as exc:
            problems.append(f"trace backend: {exc}")
            link = ""
    if not spans:
        path: Path = settings.trace_file or settings.state_dir / "spans.jsonl"
        if path.is_file():
            spans = read_spans(path, trace_id)
            source = f"span file {path}" if spans else source
        elif backend is None:
            problems.append(
                f"no trace backend runs (make otel-backend) and there is no span file at {path}"
            )
    rows, total_ms = _rows(spans)
    return TraceView(trace_id, rows, total_ms, source, problems, link)
