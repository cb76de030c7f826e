"""Smoke test of the security benchmark: a server process and real sockets (token and mTLS).

Only the shape of the results is checked, never a timing.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.auth import MODES, AuthBenchConfig, run_auth_benchmark
from tests.bench.report import auth_section


def test_auth_benchmark_returns_well_formed_results(tmp_path: Path) -> None:
    # A server process and real sockets (token and mTLS), hence tests/integration.
    config = AuthBenchConfig(
        warmup=2, latency_calls=6, rounds=2, throughput_calls=8, concurrency=2, connects=1
    )
    result = run_auth_benchmark(config, state_parent=tmp_path)

    assert set(result["modes"]) == set(MODES)
    for mode in result["modes"].values():
        assert mode["latency_us"]["n"] == 6
        assert mode["under_load_us"]["n"] == 8
        assert mode["throughput_rps"] > 0
        assert mode["first_call_ms"]["n"] == 1
    assert set(result["ratios"]) == {"token", "mtls"}
    assert [(t["variant"], t["measure"]) for t in result["targets"]] == [
        ("token", "median_latency"),
        ("token", "throughput_cost"),
    ]
    assert result["met"] == all(target["met"] for target in result["targets"])
    assert "## Cost of security" in "\n".join(auth_section(result))
    assert list(tmp_path.iterdir()) == []  # the secret, keys and audit files are gone
