"""The OTLP export that follows the recorded backend and never holds up a request: which target it
sends to, when it sends nothing, and how a failed export stops the next ones
(``runtime.telemetry._export``).

The real OTLP exporter and the TCP probe need sockets: ``tests/e2e/test_tracing_paths.py`` runs
them against a real OTLP receiver. Here the exporter it wraps is a recording one and the targets
carry no probe.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stratagem.runtime.telemetry._export import (
    BackendSpanExporter,
    ExportStats,
    Target,
    configured_target,
    recorded_target,
)


class Recording(SpanExporter):
    """An exporter that records what it was given and answers as told."""

    def __init__(self, target: Target, answer: SpanExportResult) -> None:
        self.target = target
        self.answer = answer
        self.batches: list[int] = []
        self.closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(len(spans))
        return self.answer

    def shutdown(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _spans(n: int) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("t")
    spans = []
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        span.end()
        spans.append(span)  # type: ignore[arg-type]  # an SDK span is a ReadableSpan
    return spans


@pytest.fixture
def made() -> list[Recording]:
    return []


def _exporter(
    targets: list[Target | None],
    made: list[Recording],
    clock: Clock,
    answer: SpanExportResult = SpanExportResult.SUCCESS,
) -> BackendSpanExporter:
    def make(target: Target, timeout_s: float) -> SpanExporter:
        assert timeout_s == 2.0
        recording = Recording(target, answer)
        made.append(recording)
        return recording

    return BackendSpanExporter(
        lambda: targets[0], timeout_s=2.0, make_exporter=make, clock=clock, cooldown_s=10.0
    )


HERE = Target(endpoint="http://127.0.0.1:4317", protocol="grpc", probe=None)
THERE = Target(endpoint="http://127.0.0.1:5317", protocol="grpc", probe=None)


def test_no_backend_drops_spans_without_sending(made: list[Recording]) -> None:
    clock = Clock()
    exporter = _exporter([None], made, clock)
    assert exporter.export(_spans(3)) is SpanExportResult.FAILURE
    assert made == []
    assert exporter.stats == ExportStats(skipped=3)


def test_a_backend_that_appears_later_gets_the_next_spans(made: list[Recording]) -> None:
    clock = Clock()
    targets: list[Target | None] = [None]
    exporter = _exporter(targets, made, clock)
    exporter.export(_spans(2))
    targets[0] = HERE  # `make otel-backend` after `up`
    exporter.export(_spans(1))  # looked up again only after refresh_s
    assert made == []
    clock.now += 2.0
    assert exporter.export(_spans(4)) is SpanExportResult.SUCCESS
    assert [m.target for m in made] == [HERE]
    assert made[0].batches == [4]
    assert exporter.stats == ExportStats(exported=4, skipped=3, endpoint=HERE.endpoint)


def test_a_backend_that_moves_is_followed(made: list[Recording]) -> None:
    clock = Clock()
    targets: list[Target | None] = [HERE]
    exporter = _exporter(targets, made, clock)
    exporter.export(_spans(1))
    targets[0] = THERE
    clock.now += 5.0
    exporter.export(_spans(1))
    assert [m.target for m in made] == [HERE, THERE]
    assert made[0].closed
    assert not made[1].closed
    assert exporter.stats.endpoint == THERE.endpoint


def test_a_failed_export_stops_sending_for_the_cooldown(made: list[Recording]) -> None:
    clock = Clock()
    exporter = _exporter([HERE], made, clock, answer=SpanExportResult.FAILURE)
    exporter.export(_spans(2))  # sent, failed: the breaker opens
    for _ in range(20):  # a busy agent's next batches, during the cooldown
        clock.now += 0.4
        exporter.export(_spans(1))
    assert made[0].batches == [2]
    assert exporter.stats.failed == 1
    assert exporter.stats.skipped == 22
    clock.now += 10.0
    made[0].answer = SpanExportResult.SUCCESS  # the backend is back
    exporter.export(_spans(3))
    assert made[0].batches == [2, 3]
    assert exporter.stats.exported == 3


def test_an_exporter_that_raises_counts_as_a_failed_export(made: list[Recording]) -> None:
    class Raising(Recording):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            raise RuntimeError("bug")

    exporter = BackendSpanExporter(
        lambda: HERE, make_exporter=lambda t, s: Raising(t, SpanExportResult.SUCCESS)
    )
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
    assert exporter.stats.failed == 1


def test_shutdown_closes_the_inner_exporter(made: list[Recording]) -> None:
    exporter = _exporter([HERE], made, Clock())
    exporter.export(_spans(1))
    exporter.shutdown()
    assert made[0].closed


def test_the_recorded_backend_is_read_from_the_state_dir(tmp_path: Path) -> None:
    assert recorded_target(tmp_path) is None
    folder = tmp_path / "otel-backend"
    folder.mkdir()
    (folder / "backend.json").write_text(
        json.dumps(
            {
                "kind": "phoenix",
                "pid": 1,
                "url": "http://127.0.0.1:6006",
                "otlp_endpoint": "http://127.0.0.1:4317",
                "otlp_protocol": "grpc",
                "project": "default",
            }
        )
    )
    assert recorded_target(tmp_path) == Target(
        endpoint="http://127.0.0.1:4317", protocol="grpc", probe=("127.0.0.1", 4317)
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
            Target("", "grpc", ("collector", 4317)),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://tempo.example/v1/traces",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            Target("", "http/protobuf", None),
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, Target("", "grpc", ("localhost", 4317))),
    ],
)
def test_the_configured_endpoint(
    env: dict[str, str], expected: Target | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_TRACES_EXPORTER",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert configured_target() == expected


def test_a_configured_endpoint_wins_over_the_recorded_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stratagem.runtime.telemetry._telemetry import _backend_exporter

    test_the_recorded_backend_is_read_from_the_state_dir(tmp_path)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    recorded = _backend_exporter(tmp_path)
    assert recorded is not None
    assert recorded._find_target() == recorded_target(tmp_path)
    assert _backend_exporter(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    configured = _backend_exporter(tmp_path)
    assert configured is not None
    assert configured._find_target() == Target("", "grpc", ("collector", 4317))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert _backend_exporter(tmp_path) is None
