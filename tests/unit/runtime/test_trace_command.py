"""``stratagem trace``: a trace from a span file as a waterfall, or as a JSON tree."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from typer.testing import CliRunner

from stratagem.runtime import JsonLinesSpanExporter, SpanRecord, read_spans
from stratagem.runtime._cli import _app as cli

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = "4bf92f3577b34da6ffffffffffffffff"
MS = 1_000_000


def span(
    span_id: str,
    parent: str,
    name: str,
    service: str,
    start_ms: int,
    end_ms: int,
    *,
    status: str = "UNSET",
    trace_id: str = TRACE,
    events: list[dict[str, Any]] | None = None,
    attributes: dict[str, Any] | None = None,
) -> SpanRecord:
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent,
        name=name,
        kind="INTERNAL",
        start=1_700_000_000_000 * MS + start_ms * MS,
        end=1_700_000_000_000 * MS + end_ms * MS,
        status=status,
        service=service,
        pid=1,
        attributes=attributes or {},
        events=events or [],
    )


SPANS = [
    # Written out of order, as several processes append to one file.
    span("0000000000000003", "0000000000000002", "step extract", "stratagem-orchestrator", 5, 60),
    span("0000000000000001", "", "goal", "stratagem-cli", 0, 100),
    span(
        "0000000000000002",
        "0000000000000001",
        "invoke_agent orchestrator",
        "stratagem-orchestrator",
        2,
        98,
        status="ERROR",
        events=[
            {"name": "retry", "time": 0, "attributes": {}},
            {"name": "retry", "time": 0, "attributes": {}},
        ],
    ),
    span(
        "0000000000000004",
        "0000000000000003",
        "stratagem.v1.AgentService/Call",
        "stratagem-perception",
        10,
        50,
    ),
    span(
        "0000000000000005",
        "0000000000000002",
        "step broken",
        "stratagem-orchestrator",
        61,
        90,
        status="ERROR",
        # A tool step: its attempt's span is the tool call.
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "apply_actions"},
    ),
    span("00000000000000ff", "", "other goal", "stratagem-cli", 0, 10, trace_id=OTHER),
]


@pytest.fixture
def span_file(tmp_path: Path) -> Path:
    path = tmp_path / "spans.jsonl"
    lines = [json.dumps(dataclasses.asdict(s)) for s in SPANS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def wide_console() -> Iterator[None]:
    saved = cli.console.width
    cli.console.width = 200
    yield
    cli.console.width = saved


runner = CliRunner()


def test_the_waterfall_shows_the_tree_in_order_with_durations_and_errors(
    span_file: Path, wide_console: None
) -> None:
    result = runner.invoke(cli.app, ["trace", TRACE, "--file", str(span_file)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"trace {TRACE} · 5 spans · 100.0ms" in lines[0]
    rows = [line for line in lines[1:] if "ms" in line]
    names = ["goal", "invoke_agent", "step extract", "AgentService/Call", "step broken"]
    assert [next(n for n in names if n in row) for row in rows] == names
    assert rows[1].lstrip().startswith("└─ invoke_agent orchestrator")
    assert "├─ step extract" in rows[2]
    assert "│  └─ stratagem.v1.AgentService/Call" in rows[3]
    assert "└─ step broken · tool apply_actions" in rows[4]
    assert "+0.0ms" in rows[0]
    assert "100.0ms" in rows[0]
    assert "+10.0ms" in rows[3]
    assert "40.0ms" in rows[3]
    assert "stratagem-perception" in rows[3]
    assert "retry x2" in rows[1]
    assert [("ERROR" in row) for row in rows] == [False, True, False, False, True]
    # The root spans the whole trace: its bar is full width.
    assert "█" * 32 in rows[0]


def test_json_is_a_tree_and_a_prefix_is_enough(span_file: Path) -> None:
    result = runner.invoke(cli.app, ["trace", TRACE[:20], "--file", str(span_file), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["trace_id"] == TRACE
    (root,) = out["spans"]
    assert root["name"] == "goal"
    (agent,) = root["children"]
    assert [c["name"] for c in agent["children"]] == ["step extract", "step broken"]
    assert agent["status"] == "ERROR"
    assert [e["name"] for e in agent["events"]] == ["retry", "retry"]
    call = agent["children"][0]["children"][0]
    assert (call["offset_ms"], call["duration_ms"], call["children"]) == (10.0, 40.0, [])


def test_the_file_comes_from_the_environment(
    span_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STRATAGEM_TRACE_FILE", str(span_file))
    # A state directory of its own: a Phoenix the user runs (its state in the default state
    # directory) would otherwise be asked first.
    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(tmp_path / "state"))
    result = runner.invoke(cli.app, ["trace", TRACE, "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("trace_id", "message"),
    [
        ("0123456789abcdef0123456789abcdef", "no trace '0123456789abcdef0123456789abcdef' in"),
        ("4bf92f35", "trace id prefix '4bf92f35' matches 2 traces in"),
        ("4bf92f", "must be 32 hex characters, or a prefix of at least 8"),
        ("not-a-trace-id", "must be 32 hex characters, or a prefix of at least 8"),
    ],
)
def test_bad_ids_get_one_line_and_exit_2(span_file: Path, trace_id: str, message: str) -> None:
    result = runner.invoke(cli.app, ["trace", trace_id, "--file", str(span_file)])
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert message in line


def test_a_missing_file_is_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["trace", TRACE, "--file", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "no span file at" in line


def test_the_span_file_keeps_events_and_status(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer", kind=SpanKind.SERVER) as outer:
        outer.add_event("retry", {"stratagem.step.attempt": 1})
        with tracer.start_as_current_span("inner") as inner:
            inner.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    inner_record, outer_record = sorted(read_spans(path), key=lambda r: r.name)
    assert outer_record.events[0]["name"] == "retry"
    assert outer_record.events[0]["attributes"] == {"stratagem.step.attempt": 1}
    assert outer_record.kind == "SERVER"
    assert inner_record.parent_id == outer_record.span_id
    assert inner_record.status == "ERROR"
