"""The development OpenTelemetry backend: find the Phoenix that ``make otel-backend`` started,
export to it, and read traces back from its REST API.

``scripts/otel_backend.sh start`` runs Arize Phoenix on 127.0.0.1 and writes a state file,
``STATE_DIR/otel-backend/backend.json``::

    {"kind": "phoenix", "pid": 123, "url": "http://127.0.0.1:6006",
     "otlp_endpoint": "http://127.0.0.1:4317", "otlp_protocol": "grpc", "project": "default"}

When nothing configures an OTLP trace endpoint, every process (the CLI and each agent) exports its
spans to that backend whenever it runs, started before or after ``stratagem up``
(``runtime.telemetry._export``: looked up again every few seconds, never holding up a request).
Phoenix takes traces only, so metrics are not sent there. ``PhoenixTraces`` reads one trace's spans
as ``SpanRecord`` for ``stratagem trace``.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.telemetry._backend_state import STATE_FILE, BackendState, read_backend_state
from stratagem.runtime.telemetry._telemetry import (
    INSTANCE_ATTR,
    KIND_ATTR,
    SERVICE_ATTR,
    SpanRecord,
)

__all__ = [
    "BackendError",
    "BackendState",
    "PhoenixTraces",
    "find_backend",
    "read_backend_state",
]

logger = logging.getLogger(__name__)


class BackendError(StratagemRuntimeError):
    """A trace backend could not be reached or answered with something unexpected."""


def _answers(url: str, timeout_s: float) -> bool:
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname is None or parsed.port is None:
        return False
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s):
            return True
    except OSError:
        return False


def find_backend(state_dir: Path, *, timeout_s: float = 0.5) -> BackendState | None:
    """The backend recorded under ``state_dir`` when its state file exists and its ports answer."""
    state = read_backend_state(state_dir)
    if state is None:
        return None
    if not (_answers(state.url, timeout_s) and _answers(state.otlp_endpoint, timeout_s)):
        logger.info("the backend recorded in %s does not answer", state_dir / STATE_FILE)
        return None
    return state


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Phoenix nests dotted attribute keys (``{"a": {"b": 1}}``): back to ``{"a.b": 1}``."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _nanos(stamp: str | None) -> int:
    if not stamp:
        return 0
    moment = datetime.fromisoformat(stamp)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000


def _pid(instance_id: str) -> int:
    tail = instance_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def span_record(raw: dict[str, Any]) -> SpanRecord:
    """One span of Phoenix's ``GET /v1/projects/{project}/spans`` answer as a ``SpanRecord``."""
    attributes = _flatten(raw.get("attributes") or {})
    context = raw.get("context") or {}
    instance = str(attributes.get(INSTANCE_ATTR, ""))
    return SpanRecord(
        trace_id=str(context.get("trace_id", "")),
        span_id=str(context.get("span_id", "")),
        parent_id=str(raw.get("parent_id") or ""),
        name=str(raw.get("name", "")),
        kind=str(attributes.get(KIND_ATTR, "INTERNAL")),
        start=_nanos(raw.get("start_time")),
        end=_nanos(raw.get("end_time")),
        status=str(raw.get("status_code", "UNSET")),
        service=str(attributes.get(SERVICE_ATTR, "")),
        pid=_pid(instance),
        attributes=attributes,
        events=[
            {
                "name": event.get("name", ""),
                "time": _nanos(event.get("timestamp")),
                "attributes": _flatten(event.get("attributes") or {}),
            }
            for event in raw.get("events") or []
        ],
    )


class PhoenixTraces:
    """Reads traces from Arize Phoenix's REST API (``GET /v1/projects/{project}/spans``).

    Args:
        url: Phoenix's base URL, e.g. ``http://127.0.0.1:6006``.
        project: The Phoenix project the spans went to (``default`` unless the resource sets
            ``openinference.project.name``).
        timeout_s: Per-request timeout.
    """

    def __init__(self, url: str, *, project: str = "default", timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.project = project
        self.timeout_s = timeout_s

    def _get(self, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        address = f"{self.url}{path}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout_s) as reply:
                body: dict[str, Any] = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            raise BackendError(f"{self.url} answered {exc.code} for {path}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise BackendError(f"cannot reach the trace backend at {self.url}: {exc}") from exc
        except ValueError as exc:
            raise BackendError(f"{self.url} answered {path} with something not JSON") from exc
        return body

    def raw_spans(self, trace_id: str) -> list[dict[str, Any]]:
        """Every span of ``trace_id`` (32 hex characters) as Phoenix returns it."""
        project = urllib.parse.quote(self.project, safe="")
        spans: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = [("trace_id", trace_id), ("limit", "1000")]
            if cursor:
                query.append(("cursor", cursor))
            body = self._get(f"/v1/projects/{project}/spans", query)
            spans.extend(body.get("data") or [])
            cursor = body.get("next_cursor")
            if not cursor:
                return spans

    def spans(self, trace_id: str) -> list[SpanRecord]:
        """The spans of ``trace_id`` in start order (empty when the backend has none)."""
        records = [span_record(raw) for raw in self.raw_spans(trace_id)]
        records.sort(key=lambda r: r.start)
        return records
