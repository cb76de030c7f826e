"""Dynamic steps: a map's cost per item and its memory, and a branch-and-map workflow beside
LangGraph's.

``run_map_benchmark``: a map over 10,000 items against 10,000 plain steps, the same no-op tool and
the same bound (four at once), in one event loop, alternating, after warm-up runs: the per-item
cost over the per-step cost (the issue's target: at most 1.5x). Peak RSS is each shape run once in
a fresh process (``VmHWM``), beside a process that only imported the engine, and for a map of
1,000 items: memory grows with the items' outputs (kept for the fan-in), not with tasks or spans.

``run_workflow_benchmark``: one workflow, a map over N numbers (each item doubled by a tool), the
fan-in in item order and a branch on it, as a Stratagem plan (no store, and with the SQLite state
store: every item's intent and result journaled) and as a LangGraph graph (``Send`` per item, a
conditional edge; no checkpointer, and with ``AsyncSqliteSaver``), LangGraph running from a venv
of its own under ``.bench/peers/`` (``tests/bench/peer_langgraph.py``), in the same run.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from stratagem.planning import (
    Engine,
    EngineConfig,
    MapStep,
    Plan,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    ToolRunner,
    ToolStep,
)
from tests.bench.stats import summarize

__all__ = [
    "LANGGRAPH_REQUIREMENTS",
    "DynamicBenchConfig",
    "run_map_benchmark",
    "run_workflow_benchmark",
    "workflow_plan",
]

logger = logging.getLogger(__name__)

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parents[1]
TARGET_RATIO: Final = 1.5
"""The issue's target: a map's per-item cost at most 1.5x a plain step's."""
LANGGRAPH_REQUIREMENTS: Final = ("langgraph==1.2.24", "langgraph-checkpoint-sqlite==3.1.2")
THRESHOLD: Final = 10
"""The branch: ``high`` when the doubled items sum to more than this (the peer's too)."""


@dataclass(frozen=True, slots=True)
class DynamicBenchConfig:
    """Sizes and repeats.

    Attributes:
        items: Items of the map (and plain steps it is compared with).
        bound: Items (steps) running at once.
        repeats: Timed runs of each shape.
        warmup: Untimed runs of each shape first.
        small_items: The smaller map whose peak RSS shows how memory grows.
        workflow_items: Items of the branch-and-map workflow.
        workflow_repeats: Timed runs of each workflow variant.
    """

    items: int = 10_000
    bound: int = 4
    repeats: int = 7
    warmup: int = 2
    small_items: int = 1_000
    workflow_items: int = 100
    workflow_repeats: int = 30


class DoubleTools(ToolRunner):
    """``noop`` returns ``{}``; ``double`` returns its ``n`` doubled (at once, no work)."""

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """The tool's output."""
        if name == "double":
            return {"n": input["n"] * 2}
        return {}


def map_plan(items: int, bound: int) -> Plan:
    """One map of ``items`` no-op items, ``bound`` at once."""
    return Plan(
        id="bench-map",
        owner="bench",
        goal=f"a map over {items} items",
        inputs={"items": list(range(items))},
        steps=[
            MapStep(
                id="each", over="inputs.items", max_items=items, max_parallel=bound, tool="noop"
            )
        ],
    )


def plain_plan(steps: int, bound: int) -> Plan:
    """``steps`` independent no-op steps, ``bound`` at once."""
    return Plan(
        id="bench-plain",
        owner="bench",
        goal=f"{steps} plain steps",
        max_in_flight=bound,
        steps=[ToolStep(id=f"s{i}", tool="noop") for i in range(steps)],
    )


def workflow_plan(items: int, plan_id: str = "bench-workflow") -> Plan:
    """The branch-and-map workflow: double each item (a map), then ``high`` or ``low`` on the sum
    of the fan-in."""
    total = "sum(each.items[*].n)"
    return Plan.model_validate(
        {
            "id": plan_id,
            "owner": "bench",
            "goal": "map, then branch on the fan-in",
            "inputs": {"items": list(range(items))},
            "steps": [
                {
                    "kind": "map",
                    "id": "each",
                    "over": "inputs.items",
                    "max_items": max(items, 1),
                    "max_parallel": 16,
                    "tool": "double",
                    "input": {"n": {"$expr": "item"}},
                },
                {
                    "kind": "tool",
                    "id": "high",
                    "tool": "noop",
                    "depends_on": ["each"],
                    "when": f"{total} > `{THRESHOLD}`",
                },
                {
                    "kind": "tool",
                    "id": "low",
                    "tool": "noop",
                    "depends_on": ["each"],
                    "when": f"{total} <= `{THRESHOLD}`",
                },
            ],
        }
    )


async def _timed(run: Callable[[], Awaitable[None]]) -> float:
    gc.collect()
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


async def _map_walls(config: DynamicBenchConfig) -> dict[str, list[float]]:
    engine = Engine(EngineConfig(max_in_flight=config.bound), tools=DoubleTools(), agent="bench")
    plans = {
        "map": map_plan(config.items, config.bound),
        "plain": plain_plan(config.items, config.bound),
    }

    def runner(plan: Plan) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            result = await engine.run(plan)
            if result.status is not PlanStatus.SUCCEEDED:
                raise RuntimeError(f"{plan.id} ended {result.status}: {result.failures[:1]}")

        return run

    runs = {name: runner(plan) for name, plan in plans.items()}
    for _ in range(config.warmup):
        for run in runs.values():
            await _timed(run)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for repeat in range(config.repeats):
        for name in names[repeat % 2 :] + names[: repeat % 2]:
            walls[name].append(await _timed(runs[name]))
    return walls


def _peak_rss(shape: str, items: int, bound: int) -> float:
    """Peak RSS (MiB) of a fresh process that runs one ``shape`` of ``items`` (``none``: only
    imports the engine)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.bench.dynamic", "rss", shape, str(items), str(bound)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        timeout=600,
    )
    return float(json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mib"])


def run_map_benchmark(config: DynamicBenchConfig | None = None) -> dict[str, Any]:
    """A map's per-item cost against a plain step's, and the peak RSS of each.

    Returns:
        A JSON-ready dict: ``config``, ``per_item_us`` (per shape: summary over the repeats),
        ``ratio`` (the map's median per item over the plain steps'), ``target`` (``max_ratio``,
        ``met``), ``peak_rss_mib`` (``baseline``, ``plain``, ``map``, ``map_small``) and
        ``map_bytes_per_item`` (the map's peak over the baseline, per item).
    """
    config = config or DynamicBenchConfig()
    walls = asyncio.run(_map_walls(config))
    per_item = {
        name: summarize([wall / config.items for wall in samples], scale=1e6)
        for name, samples in walls.items()
    }
    ratio = round(statistics.median(walls["map"]) / statistics.median(walls["plain"]), 3)
    rss = {
        "baseline": _peak_rss("none", 0, config.bound),
        "plain": _peak_rss("plain", config.items, config.bound),
        "map": _peak_rss("map", config.items, config.bound),
        "map_small": _peak_rss("map", config.small_items, config.bound),
    }
    return {
        "config": asdict(config),
        "per_item_us": per_item,
        "ratio": ratio,
        "target": {"max_ratio": TARGET_RATIO, "met": ratio <= TARGET_RATIO},
        "peak_rss_mib": rss,
        "map_bytes_per_item": round((rss["map"] - rss["baseline"]) * 2**20 / config.items),
    }


# --- the branch-and-map workflow beside LangGraph ------------------------------------------------


async def _workflow_walls(
    items: int, warmup: int, repeats: int, folder: Path
) -> dict[str, list[float]]:
    tools = DoubleTools()
    memory = Engine(tools=tools, agent="bench")
    walls: dict[str, list[float]] = {"memory": [], "sqlite": []}
    async with SqliteStateStore(folder / f"stratagem-{uuid.uuid4().hex[:8]}.db") as store:
        durable = Engine(tools=tools, agent="bench", store=store)
        counter = iter(range(10**9))

        async def once(name: str) -> float:
            engine = memory if name == "memory" else durable
            plan = workflow_plan(items, f"bench-workflow-{next(counter)}")
            gc.collect()
            started = time.perf_counter()
            result = await engine.run(plan)
            wall = time.perf_counter() - started
            if (
                result.status is not PlanStatus.SUCCEEDED
                or len(result.outputs["each"]["items"]) != items
            ):
                raise RuntimeError(f"the {name} workflow ended {result.status}")
            return wall

        for _ in range(warmup):
            for name in walls:
                await once(name)
        names = list(walls)
        for repeat in range(repeats):
            for name in names[repeat % 2 :] + names[: repeat % 2]:
                walls[name].append(await once(name))
    return walls


def _langgraph_python(folder: Path) -> Path:
    """The python of LangGraph's own venv, created and filled on first use."""
    venv = folder / "langgraph"
    python = venv / "bin" / "python"
    stamp = venv / ".requirements"
    wanted = "\n".join(LANGGRAPH_REQUIREMENTS)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    logger.info("workflow: installing %s into %s", " ".join(LANGGRAPH_REQUIREMENTS), venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *LANGGRAPH_REQUIREMENTS],
        check=True,
        capture_output=True,
    )
    stamp.write_text(wanted)
    return python


def run_workflow_benchmark(
    config: DynamicBenchConfig | None = None, *, folder: Path | None = None
) -> dict[str, Any]:
    """The branch-and-map workflow in Stratagem and in LangGraph, each without and with SQLite.

    Returns:
        A JSON-ready dict: ``config``, ``peer`` (LangGraph's pinned requirements), ``variants``
        (per variant: ``run_ms`` summary and ``per_item_us`` median), ``ratios`` (Stratagem's
        median over LangGraph's, without and with SQLite), or ``skipped`` with the reason when
        LangGraph could not be installed.
    """
    config = config or DynamicBenchConfig()
    folder = folder or REPO / ".bench" / "peers"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        python = _langgraph_python(folder)
    except (subprocess.CalledProcessError, OSError) as exc:
        return {"skipped": f"LangGraph could not be installed: {exc}"}
    items, repeats = config.workflow_items, config.workflow_repeats
    walls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="workflow-", dir=folder) as work:
        # Rounds alternate the two harnesses, so neither always runs on a warmer machine.
        for round_ in range(3):
            ours = asyncio.run(_workflow_walls(items, 3, repeats // 3, Path(work)))
            peer = subprocess.run(
                [str(python), str(HERE / "peer_langgraph.py"), "drive", str(items), "3",
                 str(repeats // 3), work],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=900,
                check=False,
            )  # fmt: skip
            if peer.returncode != 0:
                raise RuntimeError(
                    f"the LangGraph driver exited {peer.returncode}: {peer.stderr[-2000:]}"
                )
            theirs = json.loads(peer.stdout.strip().splitlines()[-1])
            for name, samples in (
                *((f"stratagem_{k}", v) for k, v in ours.items()),
                *((f"langgraph_{k}", v) for k, v in theirs.items()),
            ):
                walls.setdefault(name, []).extend(samples)
            logger.info("workflow: round %d/3 done", round_ + 1)
    medians = {name: statistics.median(samples) for name, samples in walls.items()}
    return {
        "config": {"items": items, "repeats": len(walls["stratagem_memory"]), "max_parallel": 16},
        "peer": list(LANGGRAPH_REQUIREMENTS),
        "variants": {
            name: {
                "run_ms": summarize(samples, scale=1e3),
                "per_item_us": round(medians[name] / items * 1e6, 2),
            }
            for name, samples in walls.items()
        },
        "ratios": {
            "memory": round(medians["stratagem_memory"] / medians["langgraph_memory"], 3),
            "sqlite": round(medians["stratagem_sqlite"] / medians["langgraph_sqlite"], 3),
        },
    }


def _rss(shape: str, items: int, bound: int) -> None:
    """Run one ``shape`` and print the process's peak RSS in MiB."""
    if shape != "none":
        plan = map_plan(items, bound) if shape == "map" else plain_plan(items, bound)
        engine = Engine(EngineConfig(max_in_flight=bound), tools=DoubleTools(), agent="bench")
        result = asyncio.run(engine.run(plan))
        if result.status is not PlanStatus.SUCCEEDED:
            raise SystemExit(f"{shape} ended {result.status}")
    print(json.dumps({"peak_rss_mib": round(_peak_kib() / 1024, 1)}), flush=True)


def _peak_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM`` (which ``exec`` resets; ``ru_maxrss`` keeps
    the forking parent's peak), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: Sequence[str]) -> None:
    """``rss SHAPE ITEMS BOUND``: one run in this process, its peak RSS printed."""
    if argv[0] != "rss":
        raise SystemExit(f"unknown command {argv[0]!r}")
    _rss(argv[1], int(argv[2]), int(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
