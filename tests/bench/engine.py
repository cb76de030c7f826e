"""Engine overhead per step: ``planning.Engine`` versus a bare asyncio Kahn loop, same DAG.

The plan is layered: ``layers`` layers of ``width`` steps, each step after the first layer depending
on ``fan_in`` steps of the layer before it. Every step calls a no-op tool that returns ``{}`` at
once, so what is measured is scheduling, bookkeeping, events and (optionally) spans, not work.

Three variants run in one event loop, in rotating order on every repeat:

* ``bare_loop``: asyncio tasks, dependency counts, a ready queue and an in-flight counter,
  completions handled in done-callbacks; about the least any DAG runner on asyncio can do;
* ``engine_noop_tracer``: ``Engine.run`` with no tracer provider configured (the OpenTelemetry
  API's no-op tracer, as in a process that never set one up);
* ``engine_sdk_tracer``: ``Engine.run`` with an SDK ``TracerProvider`` that has no span processor,
  so every plan, step and tool span is created and ended but exported nowhere.

All three run the same DAG under the same in-flight bound. The per-step cost of a run is its wall
time (``time.perf_counter``) divided by the number of steps; the reported figure is the median over
the repeats, after warm-up runs.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

from stratagem.planning import (
    Engine,
    EngineConfig,
    Plan,
    PlanStatus,
    ToolContext,
    ToolRunner,
    ToolStep,
)
from tests.bench.stats import summarize

__all__ = [
    "BARE",
    "ENGINE_NOOP",
    "ENGINE_SDK",
    "EngineBenchConfig",
    "NoopTools",
    "layered_plan",
    "run_bare_loop",
    "run_engine_benchmark",
]

BARE: Final = "bare_loop"
ENGINE_NOOP: Final = "engine_noop_tracer"
ENGINE_SDK: Final = "engine_sdk_tracer"
TARGET_RATIO: Final = 4.0
"""The issue's target: the engine within 4x of the bare loop's per-step cost."""

Dag = dict[str, list[str]]
"""Step id -> the ids it depends on, in plan order."""


@dataclass(frozen=True, slots=True)
class EngineBenchConfig:
    """The plan's shape and how often it runs.

    Attributes:
        layers: Layers of the plan.
        width: Steps per layer.
        fan_in: Dependencies of each step on the layer before it.
        repeats: Timed runs of each variant.
        warmup: Untimed runs of each variant first.
        max_in_flight: The in-flight bound of every variant (the engine's default by default).
    """

    layers: int = 10
    width: int = 100
    fan_in: int = 3
    repeats: int = 15
    warmup: int = 3
    max_in_flight: int = EngineConfig().max_in_flight

    def __post_init__(self) -> None:
        if min(self.layers, self.width, self.repeats, self.max_in_flight) < 1:
            raise ValueError("layers, width, repeats and max_in_flight must be at least 1")
        if not 0 <= self.fan_in <= self.width or self.warmup < 0:
            raise ValueError("fan_in must be in 0..width and warmup at least 0")

    @property
    def steps(self) -> int:
        """Steps in the plan."""
        return self.layers * self.width


class NoopTools(ToolRunner):
    """A ``planning.ToolRunner`` whose every tool returns ``{}`` at once."""

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Return an empty output without doing anything."""
        return {}


def layered_plan(config: EngineBenchConfig) -> Plan:
    """The benchmark's plan: ``layers`` x ``width`` no-op tool steps.

    Step ``j`` of layer ``i > 0`` depends on steps ``j``, ``j + 1``, ... ``j + fan_in - 1``
    (modulo ``width``) of layer ``i - 1``, so every step has exactly ``fan_in`` dependencies and
    each layer is reached from the whole layer before it.
    """
    steps: list[ToolStep] = []
    for layer in range(config.layers):
        for index in range(config.width):
            depends_on = (
                [
                    _step_id(layer - 1, (index + offset) % config.width)
                    for offset in range(config.fan_in)
                ]
                if layer
                else []
            )
            steps.append(
                ToolStep(id=_step_id(layer, index), tool="noop", input={}, depends_on=depends_on)
            )
    return Plan(
        id="bench-layered",
        owner="bench",
        goal=f"{config.layers} layers of {config.width} no-op steps",
        steps=steps,
        max_in_flight=config.max_in_flight,
    )


def _step_id(layer: int, index: int) -> str:
    return f"s{layer:03d}-{index:04d}"


async def _noop_tool() -> dict[str, Any]:
    return {}


async def run_bare_loop(dag: Dag, bound: int) -> dict[str, dict[str, Any]]:
    """Run ``dag`` with plain asyncio: Kahn's algorithm, at most ``bound`` tasks at once.

    Each step is a task awaiting a no-op coroutine; a done-callback records its output, releases
    its dependents and starts whatever is ready, and a future is resolved when nothing is left.

    Returns:
        Step id -> output, for every step.
    """
    loop = asyncio.get_running_loop()
    waiting = {step_id: len(deps) for step_id, deps in dag.items()}
    dependents: dict[str, list[str]] = {step_id: [] for step_id in dag}
    for step_id, deps in dag.items():
        for dep in deps:
            dependents[dep].append(step_id)
    ready = deque(step_id for step_id, count in waiting.items() if count == 0)
    running: dict[asyncio.Task[dict[str, Any]], str] = {}
    outputs: dict[str, dict[str, Any]] = {}
    finished: asyncio.Future[None] = loop.create_future()

    def start_ready() -> None:
        while ready and len(running) < bound:
            task = loop.create_task(_noop_tool())
            task.add_done_callback(on_done)
            running[task] = ready.popleft()

    def on_done(task: asyncio.Task[dict[str, Any]]) -> None:
        step_id = running.pop(task)
        outputs[step_id] = task.result()
        for dependent in dependents[step_id]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
        start_ready()
        if not running and not finished.done():
            finished.set_result(None)

    start_ready()
    if running:
        await finished
    return outputs


async def _timed(run: Callable[[], Awaitable[int]]) -> float:
    """Wall time of one run (after a garbage collection, so no run pays for another's garbage)."""
    gc.collect()
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


async def _measure(config: EngineBenchConfig) -> dict[str, list[float]]:
    plan = layered_plan(config)
    dag: Dag = {step.id: list(step.depends_on) for step in plan.steps}
    tools = NoopTools()
    engines = {
        ENGINE_NOOP: Engine(
            EngineConfig(max_in_flight=config.max_in_flight), tools=tools, agent="bench"
        ),
        ENGINE_SDK: Engine(
            EngineConfig(max_in_flight=config.max_in_flight),
            tools=tools,
            agent="bench",
            tracer_provider=SdkTracerProvider(shutdown_on_exit=False),
        ),
    }

    def engine_run(engine: Engine) -> Callable[[], Awaitable[int]]:
        async def run() -> int:
            result = await engine.run(plan)
            if result.status is not PlanStatus.SUCCEEDED or len(result.outputs) != config.steps:
                raise RuntimeError(f"the engine run ended {result.status}: {result.failures[:1]}")
            return len(result.outputs)

        return run

    async def bare_run() -> int:
        outputs = await run_bare_loop(dag, config.max_in_flight)
        if len(outputs) != config.steps:
            raise RuntimeError(f"the bare loop ran {len(outputs)} of {config.steps} steps")
        return len(outputs)

    runs: dict[str, Callable[[], Awaitable[int]]] = {
        BARE: bare_run,
        ENGINE_NOOP: engine_run(engines[ENGINE_NOOP]),
        ENGINE_SDK: engine_run(engines[ENGINE_SDK]),
    }
    names = list(runs)
    for _ in range(config.warmup):
        for name in names:
            await _timed(runs[name])
    walls: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(config.repeats):
        # Rotate the order so no variant always runs first (or right after another one).
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            walls[name].append(await _timed(runs[name]))
    return walls


SCALE_LAYERS: Final = 1000
"""Layers of the scale run's plan: 1,000 of the config's width (100): 100,000 steps."""
FLAT_RATIO: Final = 1.25
"""Per-step cost at 100,000 steps within this factor of the cost at 1,000: flat."""


async def _scale(config: EngineBenchConfig, layers: int, repeats: int) -> dict[str, Any]:
    """The no-op-tracer engine's per-step cost on the config's plan and on one ``layers`` deep."""
    engine = Engine(EngineConfig(max_in_flight=config.max_in_flight), tools=NoopTools(), agent="b")
    out: dict[str, Any] = {}
    for name, shape in (
        ("small", config),
        ("large", replace(config, layers=layers)),
    ):
        plan = layered_plan(shape)

        async def run(plan: Plan = plan, steps: int = shape.steps) -> int:
            result = await engine.run(plan)
            if result.status is not PlanStatus.SUCCEEDED or len(result.outputs) != steps:
                raise RuntimeError(f"the engine run ended {result.status}: {result.failures[:1]}")
            return steps

        await _timed(run)  # warm-up
        walls = [await _timed(run) for _ in range(repeats)]
        out[name] = {
            "steps": shape.steps,
            "per_step_us": round(statistics.median(walls) / shape.steps * 1e6, 3),
            "runs": repeats,
        }
    ratio = round(out["large"]["per_step_us"] / out["small"]["per_step_us"], 3)
    return {**out, "ratio": ratio, "max_ratio": FLAT_RATIO, "flat": ratio <= FLAT_RATIO}


def run_engine_benchmark(config: EngineBenchConfig | None = None) -> dict[str, Any]:
    """Run the engine benchmark in a fresh event loop and summarize it.

    Args:
        config: The plan's shape and the repeats; ``EngineBenchConfig()`` by default.

    Returns:
        A JSON-ready dict: ``config``, ``tracer_provider`` (the global provider's type, which the
        no-op variant uses), ``variants`` (per variant: ``per_step_us`` summary over the repeats,
        ``run_ms`` median, ``samples_us`` per step), ``ratios`` (each engine variant's median per
        step over the bare loop's), ``target`` (``max_ratio``, ``ratio``, ``met``) and ``scale``
        (the no-op-tracer engine's per-step cost at the config's steps and at 100,000 steps:
        ``small``, ``large``, ``ratio``, ``flat``).
    """
    config = config or EngineBenchConfig()
    walls = asyncio.run(_measure(config))
    scale = asyncio.run(_scale(config, SCALE_LAYERS, repeats=3))
    variants: dict[str, Any] = {}
    for name, samples in walls.items():
        per_step = [wall / config.steps for wall in samples]
        variants[name] = {
            "per_step_us": summarize(per_step, scale=1e6),
            "run_ms": round(statistics.median(samples) * 1e3, 3),
            "samples_us": [round(value * 1e6, 3) for value in per_step],
        }
    bare = statistics.median(walls[BARE])
    ratios = {
        name: round(statistics.median(walls[name]) / bare, 3) for name in (ENGINE_NOOP, ENGINE_SDK)
    }
    return {
        "config": {**asdict(config), "steps": config.steps},
        "scale": scale,
        "tracer_provider": type(trace.get_tracer_provider()).__name__,
        "variants": variants,
        "ratios": ratios,
        "target": {
            "variant": ENGINE_NOOP,
            "max_ratio": TARGET_RATIO,
            "ratio": ratios[ENGINE_NOOP],
            "met": ratios[ENGINE_NOOP] <= TARGET_RATIO,
        },
    }
