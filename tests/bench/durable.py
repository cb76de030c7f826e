"""Durable checkpoints: per-step cost with a ``SqliteStateStore`` beside the same plan without one.

The plan is ``engine.layered_plan``'s (1,000 no-op steps in 10 layers of 100 by default). Three
variants run in one event loop, in rotating order on every repeat:

* ``no_store``: ``Engine.run`` without a store (checkpoints off), the no-op tracer;
* ``sqlite_idempotent``: ``Engine(store=SqliteStateStore(...))``, tools the runner declares
  idempotent. Such steps of a budget-free plan do not wait for their intent's commit
  (``docs/durability.md``), so the store's writes overlap the steps;
* ``sqlite_side_effecting``: the same store, tools declared not idempotent: every step waits for
  the commit holding its intent before its tool runs, as a side-effecting tool must.

Each durable run gets a fresh plan id (a finished plan is not run again) in one store file per
variant under ``.bench/``. The per-step cost of a run is its wall time divided by its steps; the
figure is the median over the repeats, after warm-up runs.

Store size: a fresh store runs one plan of ``small_steps`` steps, another fresh store one plan of
``large_steps`` steps (side-effecting tools, the most durable writes); after each, the store's own
``stats()`` (which checkpoints the WAL) and the files' bytes on disk (database plus WAL).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from stratagem.planning import (
    Engine,
    EngineConfig,
    Plan,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    ToolRunner,
)
from tests.bench.engine import EngineBenchConfig, layered_plan
from tests.bench.stats import summarize

__all__ = [
    "IDEMPOTENT",
    "NO_STORE",
    "SIDE_EFFECTING",
    "DurableBenchConfig",
    "DurableTools",
    "run_durable_benchmark",
]

NO_STORE: Final = "no_store"
IDEMPOTENT: Final = "sqlite_idempotent"
SIDE_EFFECTING: Final = "sqlite_side_effecting"
TARGET_RATIO: Final = 2.5
"""Issue 15's target: checkpoints cost at most 2.5x the checkpoint-free engine per step."""
LINEAR_RANGE: Final = (0.8, 1.25)
"""Linear growth: bytes(large) / bytes(small) within this factor of large_steps / small_steps."""


@dataclass(frozen=True, slots=True)
class DurableBenchConfig:
    """The plans' shapes, the repeats and where the store files go.

    Attributes:
        plan: The timed plan's shape (and repeats, warm-up, in-flight bound).
        small_layers: Layers (of ``plan.width``) of the first store-size plan.
        large_layers: Layers of the second store-size plan.
    """

    plan: EngineBenchConfig = field(default_factory=EngineBenchConfig)
    small_layers: int = 10
    large_layers: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.small_layers < self.large_layers:
            raise ValueError("small_layers must be at least 1 and less than large_layers")

    @property
    def small_steps(self) -> int:
        """Steps of the first store-size plan."""
        return self.small_layers * self.plan.width

    @property
    def large_steps(self) -> int:
        """Steps of the second store-size plan."""
        return self.large_layers * self.plan.width


class DurableTools(ToolRunner):
    """A ``planning.ToolRunner`` of no-op tools, all declared idempotent or all not."""

    def __init__(self, *, idempotent: bool) -> None:
        self.idempotent = idempotent

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Return an empty output without doing anything."""
        return {}

    def is_idempotent(self, name: str) -> bool:
        """What the runner was built with, for every tool."""
        return self.idempotent


def _fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def _disk_bytes(path: Path) -> dict[str, int]:
    sizes = {}
    for suffix, key in (("", "db"), ("-wal", "wal")):
        file = Path(f"{path}{suffix}")
        sizes[key] = file.stat().st_size if file.exists() else 0
    return sizes


async def _timed(run: Callable[[], Awaitable[None]]) -> float:
    gc.collect()
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


def _check(result: Any, steps: int) -> None:
    if result.status is not PlanStatus.SUCCEEDED or len(result.outputs) != steps:
        raise RuntimeError(f"the engine run ended {result.status}: {result.failures[:1]}")


async def _measure(config: DurableBenchConfig, folder: Path) -> dict[str, list[float]]:
    shape = config.plan
    plan = layered_plan(shape)
    engine_config = EngineConfig(max_in_flight=shape.max_in_flight)
    counter = 0

    def renamed() -> Plan:
        nonlocal counter
        counter += 1
        return plan.model_copy(update={"id": f"bench-durable-{counter}"})

    async with (
        SqliteStateStore(_fresh(folder / "durable-idempotent.db")) as idempotent_store,
        SqliteStateStore(_fresh(folder / "durable-side-effecting.db")) as effecting_store,
    ):
        engines = {
            NO_STORE: Engine(engine_config, tools=DurableTools(idempotent=False), agent="bench"),
            IDEMPOTENT: Engine(
                engine_config,
                tools=DurableTools(idempotent=True),
                agent="bench",
                store=idempotent_store,
            ),
            SIDE_EFFECTING: Engine(
                engine_config,
                tools=DurableTools(idempotent=False),
                agent="bench",
                store=effecting_store,
            ),
        }

        def runner(engine: Engine) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                _check(await engine.run(renamed()), shape.steps)

            return run

        runs = {name: runner(engine) for name, engine in engines.items()}
        names = list(runs)
        for _ in range(shape.warmup):
            for name in names:
                await _timed(runs[name])
        walls: dict[str, list[float]] = {name: [] for name in names}
        for repeat in range(shape.repeats):
            # Rotate the order so no variant always runs first (or right after another one).
            offset = repeat % len(names)
            for name in names[offset:] + names[:offset]:
                walls[name].append(await _timed(runs[name]))
    return walls


async def _store_size(shape: EngineBenchConfig, path: Path) -> dict[str, Any]:
    plan = layered_plan(shape).model_copy(update={"id": f"bench-size-{shape.steps}"})
    async with SqliteStateStore(_fresh(path)) as store:
        engine = Engine(
            EngineConfig(max_in_flight=shape.max_in_flight),
            tools=DurableTools(idempotent=False),
            agent="bench",
            store=store,
        )
        started = time.perf_counter()
        _check(await engine.run(plan), shape.steps)
        run_s = time.perf_counter() - started
        stats = await store.stats()
        disk = _disk_bytes(path)
    return {
        "steps": shape.steps,
        "plans": stats.plans,
        "records": stats.records,
        "records_per_step": round(stats.records / shape.steps, 3),
        "bytes": stats.bytes,
        "bytes_per_step": round(stats.bytes / shape.steps, 1),
        "file_bytes": disk["db"] + disk["wal"],
        "db_file_bytes": disk["db"],
        "wal_file_bytes": disk["wal"],
        "run_s": round(run_s, 3),
    }


def run_durable_benchmark(
    config: DurableBenchConfig | None = None, *, folder: Path
) -> dict[str, Any]:
    """Run the checkpoint benchmark and the store-size runs in a fresh event loop; summarize.

    Args:
        config: The plans and repeats; ``DurableBenchConfig()`` by default.
        folder: Where the SQLite files go (created if missing; files of earlier runs replaced).

    Returns:
        A JSON-ready dict: ``config``; ``variants`` (per variant: ``per_step_us`` summary,
        ``run_ms`` median, ``samples_us``); ``ratios`` (each store variant's median per step over
        ``no_store``'s); ``target`` (``max_ratio`` and, per store variant, ``ratio`` and ``met``);
        ``store_size`` (``small`` and ``large``: steps, plans, records, bytes in use, file bytes;
        ``growth`` of bytes, file bytes and records, ``steps_ratio``, the ``linear_range`` of
        allowed growth over steps and ``linear``).
    """
    config = config or DurableBenchConfig()
    folder.mkdir(parents=True, exist_ok=True)
    walls = asyncio.run(_measure(config, folder))
    shape = config.plan
    variants: dict[str, Any] = {}
    for name, samples in walls.items():
        per_step = [wall / shape.steps for wall in samples]
        variants[name] = {
            "per_step_us": summarize(per_step, scale=1e6),
            "run_ms": round(statistics.median(samples) * 1e3, 3),
            "samples_us": [round(value * 1e6, 3) for value in per_step],
        }
    base = statistics.median(walls[NO_STORE])
    ratios = {
        name: round(statistics.median(walls[name]) / base, 3)
        for name in (IDEMPOTENT, SIDE_EFFECTING)
    }

    def sized(layers: int) -> EngineBenchConfig:
        return EngineBenchConfig(
            layers=layers,
            width=shape.width,
            fan_in=shape.fan_in,
            repeats=1,
            warmup=0,
            max_in_flight=shape.max_in_flight,
        )

    small = asyncio.run(_store_size(sized(config.small_layers), folder / "size-small.db"))
    large = asyncio.run(_store_size(sized(config.large_layers), folder / "size-large.db"))
    steps_ratio = large["steps"] / small["steps"]
    growth = {key: round(large[key] / small[key], 3) for key in ("bytes", "file_bytes", "records")}
    low, high = LINEAR_RANGE
    return {
        "config": {
            **asdict(shape),
            "steps": shape.steps,
            "small_steps": config.small_steps,
            "large_steps": config.large_steps,
        },
        "variants": variants,
        "ratios": ratios,
        "target": {
            "baseline": NO_STORE,
            "max_ratio": TARGET_RATIO,
            "variants": {
                name: {"ratio": ratio, "met": ratio <= TARGET_RATIO}
                for name, ratio in ratios.items()
            },
        },
        "store_size": {
            "small": small,
            "large": large,
            "steps_ratio": steps_ratio,
            "growth": growth,
            "linear_range": [round(low * steps_ratio, 3), round(high * steps_ratio, 3)],
            "linear": low * steps_ratio <= growth["bytes"] <= high * steps_ratio,
        },
    }
