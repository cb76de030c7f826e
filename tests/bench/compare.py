"""The engine's per-step cost and the checkpointed ratio of several commits, interleaved in one run.

``python -m tests.bench.compare REV [REV ...]`` (a commit, a branch, or ``.`` for the work tree):
each revision's ``protocol/``, ``planning/``, ``agents/`` and ``runtime/`` are taken out of git
(``git archive``) into ``.bench/compare/<rev>/stratagem/``, and the rounds run each revision in a
fresh child process of its own, in rotating order, so that the machine's load falls on every
revision alike. A round measures, in one event loop (the harness of ``tests.bench.engine`` and
``tests.bench.durable``, the plan of section 2 of BENCHMARKS.md: 1,000 no-op tool steps in 10
layers of 100, fan-in 3, in-flight bound 4):

* ``engine_noop_tracer``: ``Engine.run`` without a store or a tracer provider, µs per step;
* ``no_store``, ``sqlite_side_effecting`` and ``sqlite_idempotent``: the same plan with a fresh
  plan id per run, without a store and with a ``SqliteStateStore`` (tools declared not idempotent,
  then idempotent), µs per step, and each store's ratio to ``no_store`` (the checkpointed ratio).

Each figure is the median of a round's timed runs, in the process's CPU time by default (all its
threads, the store's writer included: on a loaded machine the wall time mostly measures the
load; ``--clock wall`` for the wall time); the summary gives the median over the rounds, and each
revision's figures over the first revision's, paired round by round (``vs_first``). Only ratios
and medians of the same run compare: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "planning", "agents", "runtime")

_ROUND = r"""
import asyncio, gc, json, statistics, sys, tempfile, time
from pathlib import Path
from stratagem.planning import Engine, EngineConfig, PlanStatus, SqliteStateStore
from tests.bench.durable import DurableTools
from tests.bench.engine import EngineBenchConfig, NoopTools, layered_plan

runs, warmup, cpu = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "cpu"
shape = EngineBenchConfig()
plan = layered_plan(shape)
config = EngineConfig(max_in_flight=shape.max_in_flight)
counter = 0


async def timed(engine, fresh):
    global counter
    counter += 1
    run_plan = plan.model_copy(update={"id": f"compare-{counter}"}) if fresh else plan
    gc.collect()
    started = time.process_time() if cpu else time.perf_counter()
    result = await engine.run(run_plan)
    spent = (time.process_time() if cpu else time.perf_counter()) - started
    if result.status is not PlanStatus.SUCCEEDED or len(result.outputs) != shape.steps:
        raise RuntimeError(f"the run ended {result.status}")
    return spent / shape.steps * 1e6


async def main():
    folder = Path(tempfile.mkdtemp(prefix="compare-"))
    effecting_tools = DurableTools(idempotent=False)
    idempotent_tools = DurableTools(idempotent=True)
    async with (
        SqliteStateStore(folder / "effecting.db") as effecting,
        SqliteStateStore(folder / "idempotent.db") as idempotent,
    ):
        variants = {
            "engine_noop_tracer": (Engine(config, tools=NoopTools(), agent="bench"), False),
            "no_store": (Engine(config, tools=effecting_tools, agent="bench"), True),
            "sqlite_side_effecting": (
                Engine(config, tools=effecting_tools, agent="bench", store=effecting),
                True,
            ),
            "sqlite_idempotent": (
                Engine(config, tools=idempotent_tools, agent="bench", store=idempotent),
                True,
            ),
        }
        names = list(variants)
        for _ in range(warmup):
            for name in names:
                await timed(*variants[name])
        samples = {name: [] for name in names}
        for repeat in range(runs):
            offset = repeat % len(names)
            for name in names[offset:] + names[:offset]:
                samples[name].append(await timed(*variants[name]))
    print(json.dumps({name: statistics.median(values) for name, values in samples.items()}))


asyncio.run(main())
"""


def _tree(rev: str, root: Path) -> Path:
    """``rev``'s packages under ``root/<rev>/stratagem/`` (the work tree's own for ``.``)."""
    name = "worktree" if rev == "." else rev.replace("/", "_")
    where = root / name
    shutil.rmtree(where, ignore_errors=True)
    target = where / "stratagem"
    target.mkdir(parents=True)
    if rev == ".":
        for package in PACKAGES:
            ignore = shutil.ignore_patterns("*.pyc", "__pycache__")
            shutil.copytree(REPO / package, target / package, ignore=ignore)
        return where
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, *PACKAGES],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return where


def _round(tree: Path, runs: int, warmup: int, clock: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])}
    env.pop("OTEL_TRACES_EXPORTER", None)
    with tempfile.TemporaryDirectory() as cwd:  # nothing of the work tree's on the path first
        out = subprocess.run(
            [sys.executable, "-c", _ROUND, str(runs), str(warmup), clock],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
        ).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def compare(
    revs: list[str], rounds: int, runs: int, warmup: int, clock: str = "cpu"
) -> dict[str, Any]:
    """Every revision's medians per round, the median over rounds, the checkpointed ratios, and
    each revision's figures over the first's, paired round by round (``vs_first``)."""
    root = REPO / ".bench" / "compare"
    trees = {rev: _tree(rev, root) for rev in revs}
    per_round: dict[str, list[dict[str, float]]] = {rev: [] for rev in revs}
    for n in range(rounds):
        order = revs[n % len(revs) :] + revs[: n % len(revs)]
        for rev in order:
            per_round[rev].append(_round(trees[rev], runs, warmup, clock))
            print(f"round {n + 1}/{rounds} {rev}: {per_round[rev][-1]}", file=sys.stderr)
    summary: dict[str, Any] = {}
    first = per_round[revs[0]]
    for rev, found in per_round.items():
        medians = {name: statistics.median(r[name] for r in found) for name in found[0]}
        ratios = [
            {
                store: r[store] / r["no_store"]
                for store in ("sqlite_side_effecting", "sqlite_idempotent")
            }
            for r in found
        ]
        summary[rev] = {
            "per_step_us": {name: round(value, 2) for name, value in medians.items()},
            "checkpointed_ratio": {
                store: round(statistics.median(r[store] for r in ratios), 3)
                for store in ("sqlite_side_effecting", "sqlite_idempotent")
            },
            "vs_first": {
                name: round(
                    statistics.median(r[name] / f[name] for r, f in zip(found, first, strict=True)),
                    3,
                )
                for name in found[0]
            },
            "rounds": found,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="commits or branches; '.' for the work tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each variant a round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="the process's CPU time (steadier on a loaded machine) or the wall time",
    )
    args = parser.parse_args()
    summary = compare(args.revs, args.rounds, args.runs, args.warmup, args.clock)
    for rev, figures in summary.items():
        print(rev, json.dumps({k: v for k, v in figures.items() if k != "rounds"}))
    out = REPO / ".bench" / "compare.json"
    out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
