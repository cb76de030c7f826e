"""The development backend: Phoenix's span JSON as SpanRecord, and when the CLI exports to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.runtime.telemetry._backend import find_backend, read_backend_state, span_record

PHOENIX_SPAN = {
    "id": "U3Bhbjox",
    "name": "stratagem.v1.AgentService/Call",
    "context": {"trace_id": "ab" * 16, "span_id": "cd" * 8},
    "span_kind": "UNKNOWN",
    "parent_id": "ef" * 8,
    "start_time": "2026-01-02T03:04:05.000100+00:00",
    "end_time": "2026-01-02T03:04:05.002600+00:00",
    "status_code": "ERROR",
    "status_message": "PERMISSION_DENIED: no",
    # Phoenix nests dotted keys.
    "attributes": {
        "rpc": {"system": "grpc", "method": "Call", "grpc": {"status_code": 7}},
        "stratagem": {
            "service": {"name": "stratagem-perception", "instance": {"id": "perception-4242"}},
            "span": {"kind": "SERVER"},
        },
    },
    "events": [
        {
            "name": "retry",
            "timestamp": "2026-01-02T03:04:05.001+00:00",
            "attributes": {"stratagem": {"step": {"attempt": 1}}},
        }
    ],
}


def test_a_phoenix_span_becomes_a_span_record() -> None:
    record = span_record(PHOENIX_SPAN)
    assert (record.trace_id, record.span_id, record.parent_id) == ("ab" * 16, "cd" * 8, "ef" * 8)
    assert record.kind == "SERVER"
    assert record.service == "stratagem-perception"
    assert record.pid == 4242
    assert record.status == "ERROR"
    assert record.duration_ms == pytest.approx(2.5)
    assert record.attributes["rpc.grpc.status_code"] == 7
    assert record.attributes["rpc.method"] == "Call"
    assert record.events == [
        {
            "name": "retry",
            "time": record.start + 900_000,
            "attributes": {"stratagem.step.attempt": 1},
        }
    ]


def test_a_root_span_without_identity_attributes() -> None:
    record = span_record({**PHOENIX_SPAN, "parent_id": None, "attributes": {}, "events": []})
    assert (record.parent_id, record.kind, record.service, record.pid) == ("", "INTERNAL", "", 0)


def test_no_state_file_no_backend(tmp_path: Path) -> None:
    assert find_backend(tmp_path) is None
    assert read_backend_state(tmp_path) is None
    (tmp_path / "otel-backend").mkdir()
    (tmp_path / "otel-backend" / "backend.json").write_text("not json")
    assert find_backend(tmp_path) is None
    assert read_backend_state(tmp_path) is None
