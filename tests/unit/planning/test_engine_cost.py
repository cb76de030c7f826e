"""The engine's per-step cost, counted in Python calls rather than timed.

cProfile's count of calls over a run is the same on a busy machine as on an idle one (a time is
not), so it can hold the line: issue 33 asks the per-step cost back to a8d62c1's. On this plan (the
bench's: BENCHMARKS.md section 2) a8d62c1 made 91.7 calls a plain tool step with the no-op tracer
and 130.9 with a ``SqliteStateStore`` (side-effecting tools); fc81414 93.7 and 139.0. The times are
in BENCHMARKS.md's issue-33 section.
"""

from __future__ import annotations

import cProfile
from pathlib import Path
from typing import Any

from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import NoOpTracerProvider

from stratagem.planning import (
    Engine,
    EngineConfig,
    Plan,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    ToolRunner,
    ToolStep,
)

A8D62C1_NOOP = 91.69  # a8d62c1 measured, rounded up
A8D62C1_CHECKPOINTED = 130.92  # likewise


class _Noop(ToolRunner):
    """Every tool returns ``{}`` at once; none is idempotent (every intent is waited for)."""

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {}


def _layered(plan_id: str, layers: int = 10, width: int = 100, fan_in: int = 3) -> Plan:
    """The bench's plan (``tests/bench/engine.layered_plan``): 1,000 no-op tool steps."""
    steps = [
        ToolStep(
            id=f"l{layer}s{index}",
            tool="noop",
            input={},
            depends_on=[f"l{layer - 1}s{(index + k) % width}" for k in range(fan_in)]
            if layer
            else [],
        )
        for layer in range(layers)
        for index in range(width)
    ]
    return Plan(id=plan_id, owner="bench", goal="layers", steps=steps, max_in_flight=4)


async def _calls_per_step(engine: Engine, plan: Plan) -> float:
    profile = cProfile.Profile()
    profile.enable()
    try:
        result = await engine.run(plan)
    finally:
        profile.disable()
    assert result.status is PlanStatus.SUCCEEDED
    # Summed per code object (pstats keys by file, line and name: dataclass __init__s collide).
    return sum(entry.callcount for entry in profile.getstats()) / len(plan.steps)


def _engine(store: SqliteStateStore | None = None) -> Engine:
    # Providers given: a global SDK provider another test set up must not count here.
    return Engine(
        EngineConfig(max_in_flight=4),
        tools=_Noop(),
        agent="bench",
        store=store,
        tracer_provider=NoOpTracerProvider(),
        meter_provider=NoOpMeterProvider(),
    )


async def test_a_plain_tool_step_makes_no_more_calls_than_at_a8d62c1() -> None:
    engine = _engine()
    await engine.run(_layered("warm"))
    calls = await _calls_per_step(engine, _layered("counted"))
    assert calls <= A8D62C1_NOOP, f"{calls:.2f} Python calls a step (a8d62c1: {A8D62C1_NOOP})"


async def test_a_checkpointed_step_makes_no_more_calls_than_at_a8d62c1(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "state.db") as store:
        engine = _engine(store)
        await engine.run(_layered("warm"))
        calls = await _calls_per_step(engine, _layered("counted"))
    assert calls <= A8D62C1_CHECKPOINTED, (
        f"{calls:.2f} Python calls a checkpointed step (a8d62c1: {A8D62C1_CHECKPOINTED})"
    )
