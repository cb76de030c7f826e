"""Smoke test of the history benchmark: real gRPC servers and SQLite files, a tiny store.

Only the shape of the results is checked, never a timing.
"""

from __future__ import annotations

from tests.bench.history import CASES, HistoryBenchConfig, run_history_benchmark
from tests.bench.report import history_section


def test_history_benchmark_returns_well_formed_results() -> None:
    config = HistoryBenchConfig(
        plans=400, steps=2, page_size=10, warmup=1, repeats=2, postgres=False
    )
    result = run_history_benchmark(config)
    sqlite = result["stores"]["sqlite"]
    assert set(sqlite["cases_ms"]) == set(CASES)
    assert all(item["n"] == 2 for item in sqlite["cases_ms"].values())
    assert sqlite["text_matches"] == 1  # plan 7 of 400 mentions the lighthouse keeper
    assert result["stores"]["postgres"] == {"skipped": "no PostgreSQL server was reachable"}
    assert [(t["store"], t["case"]) for t in result["targets"]] == [("sqlite", "first_page")]
    assert result["met"] == all(t["met"] for t in result["targets"])
    assert "## History: one page of 10,000 stored plans" in "\n".join(history_section(result))
