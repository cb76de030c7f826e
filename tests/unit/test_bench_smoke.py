"""Smoke test of the engine benchmark: a tiny plan, one repeat, well-formed results.

Only the shape of the results is checked, never a timing: the figures themselves are
``make bench``'s business.
"""

from __future__ import annotations

import math

from tests.bench.engine import (
    BARE,
    ENGINE_NOOP,
    ENGINE_SDK,
    EngineBenchConfig,
    layered_plan,
    run_engine_benchmark,
)


def test_layered_plan_has_the_asked_shape() -> None:
    config = EngineBenchConfig(layers=3, width=5, fan_in=2)
    plan = layered_plan(config)
    assert len(plan.steps) == 15
    assert [len(step.depends_on) for step in plan.steps] == [0] * 5 + [2] * 10
    assert plan.max_in_flight == config.max_in_flight


def test_engine_benchmark_returns_well_formed_results() -> None:
    config = EngineBenchConfig(layers=2, width=10, fan_in=2, repeats=1, warmup=0)
    result = run_engine_benchmark(config)

    assert result["config"]["steps"] == 20
    assert set(result["variants"]) == {BARE, ENGINE_NOOP, ENGINE_SDK}
    for variant in result["variants"].values():
        per_step = variant["per_step_us"]
        assert set(per_step) == {"median", "p99", "min", "max", "mean", "n"}
        assert per_step["n"] == 1
        assert per_step["median"] > 0
        assert variant["run_ms"] > 0
        assert len(variant["samples_us"]) == 1
    assert set(result["ratios"]) == {ENGINE_NOOP, ENGINE_SDK}
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in result["ratios"].values())
    target = result["target"]
    assert target["variant"] == ENGINE_NOOP
    assert target["max_ratio"] == 4.0
    assert target["ratio"] == result["ratios"][ENGINE_NOOP]
    assert isinstance(target["met"], bool)
