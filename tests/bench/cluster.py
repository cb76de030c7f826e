"""Goals on a multi-node Ray cluster: goals per second and per-goal latency by goals in flight.

A Ray head and two worker nodes start on this machine (``tests.cluster._nodes.RayNodes``, as the
cluster tests start them). Two Stratagem deployments go up on it through the real ``stratagem``
command (``up --address ... --json``), in namespaces of their own and with the same placement:
strategic and orchestrator on the head, perception on worker ``a``, tactical on worker ``b``, so
every goal crosses nodes. They differ only in their state store:

* ``sqlite``: the embedded default, ``SqliteStateStore`` files in the deployment's state folder;
* ``postgresql``: ``STRATAGEM_STORE_URL=postgresql://...`` on a fresh database of the server
  ``scripts/postgres.sh`` runs (started here when none runs, and then stopped here too).

This process stays outside the cluster and pursues goals as ``stratagem submit`` does:
``runtime.run_goal`` with the operator's token, against the endpoints ``stratagem status --json``
lists. Every goal is ``agents.DEMO_GOAL`` under a plan id of its own (the orchestrator derives its
cross-agent request ids from the plan id and step, so distinct plan ids keep concurrent goals'
requests distinct), and each worker pursues it in a world of its own (``goal_in_own_world``:
concurrent goals about the same characters would move them under each other and fail at
``apply``). First one goal per worker of the highest level puts all the worlds into the
perception agent, so every level runs against the same world (a goal's spatial context holds only
the facts linked to its own entities, so the other worlds should not slow it; priming keeps the
world's size out of the comparison all the same).

For each in-flight level (1, 4, 16), and within it for each store in turn (the order alternates
from level to level), warm-up goals first, then a closed loop: ``level`` workers each start the
next goal as soon as their last one answered, until ``goals`` goals are done. Each goal's
latency is the whole ``run_goal`` call: four fresh channels, ``SubmitGoal`` and the four agents'
plan lookups. Machine-wide CPU use (``/proc/stat``) and this process's CPU time are recorded per
level, so the table shows when the cores are busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

from stratagem.agents import DEFAULT_PATTERNS, DEMO_GOAL
from stratagem.protocol import Credentials, SubmitGoalRequest
from stratagem.runtime import run_goal
from tests.bench.stats import percentile
from tests.cluster._nodes import RayNodes
from tests.cluster.conftest import REPO, Stratagem, stratagem_on
from tests.conftest import fresh_database

__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "STORES",
    "ClusterBenchConfig",
    "GoalSamples",
    "goal_in_own_world",
    "run_cluster_benchmark",
    "summarize_cluster",
]

logger = logging.getLogger("tests.bench")

SQLITE: Final = "sqlite"
POSTGRESQL: Final = "postgresql"
STORES: Final = (SQLITE, POSTGRESQL)
PLACEMENT: Final = {
    "strategic": {"labels": {"stratagem/node": "head"}},
    "orchestrator": {"labels": {"stratagem/node": "head"}},
    "perception": {"labels": {"stratagem/node": "a"}},
    "tactical": {"resources": {"stratagem-b": 0.01}},
}
"""Where the agents go: three nodes, so a goal's cross-agent calls cross nodes."""
_POSTGRES_SH: Final = REPO / "scripts" / "postgres.sh"


@dataclass(frozen=True, slots=True)
class ClusterBenchConfig:
    """Goal counts per in-flight level.

    Attributes:
        levels: Goals in flight at once, ascending; the first is the latency baseline.
        goals: Timed goals per level and store (at least ``level``).
        warmup: Untimed goals per level and store before the timed ones, as many in flight
            (at most ``level``).
        stores: The stores measured, of ``STORES``.
        goal_timeout_s: The deadline of one goal.
    """

    levels: tuple[int, ...] = (1, 4, 16)
    goals: dict[int, int] = field(default_factory=lambda: {1: 20, 4: 32, 16: 64})
    warmup: int = 2
    stores: tuple[str, ...] = STORES
    goal_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.levels or list(self.levels) != sorted(set(self.levels)) or self.levels[0] < 1:
            raise ValueError("levels must be distinct, ascending and at least 1")
        if any(self.goals.get(level, 0) < level for level in self.levels):
            raise ValueError("every level needs at least as many goals as it has in flight")
        if self.levels[-1] > len(_TAGS):
            raise ValueError(f"at most {len(_TAGS)} goals in flight (one world per worker)")
        if not self.stores or not set(self.stores) <= set(STORES):
            raise ValueError(f"stores must be some of {STORES}")


@dataclass(slots=True)
class GoalSamples:
    """What one store at one level measured.

    Attributes:
        latencies_s: Each finished goal's latency, in seconds (failed goals' too).
        wall_s: From the first timed goal's start to the last one's answer.
        failures: Goals that raised or did not succeed, as ``"plan_id: reason"``.
        busy_cores: Machine-wide busy cores (``/proc/stat``) over the wall time; ``None`` without.
        client_cpu_s: This process's CPU time over the wall time.
    """

    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    busy_cores: float | None = None
    client_cpu_s: float = 0.0


# --- the machine's CPU ---------------------------------------------------------------------------


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat; ``None`` without it."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0]
    except OSError:
        return None
    values = [int(v) for v in first.split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user time
    return total - idle, total


def _busy_cores(
    before: tuple[int, int] | None, after: tuple[int, int] | None, cores: int
) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * cores


# --- PostgreSQL --------------------------------------------------------------------------------


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@contextlib.contextmanager
def _postgres_database() -> Iterator[tuple[str, bool]]:
    """A fresh database as a ``postgresql://`` URL, and whether the server was started here.

    A server that already runs (another run's, the tests') is used and left running; one started
    here is stopped on the way out. The database is dropped either way.
    """
    script = ["bash", str(_POSTGRES_SH)]
    server = subprocess.run(
        [*script, "url"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    started = False
    if not server or not _reachable(server):
        done = subprocess.run(
            [*script, "start"], capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/postgres.sh start failed: {done.stderr.strip()[-800:]}")
        server = done.stdout.strip().splitlines()[-1]
        started = True
    try:
        with fresh_database(server) as conninfo:
            parts = conninfo_to_dict(conninfo)
            yield (
                f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}",
                started,
            )
    finally:
        if started:
            subprocess.run([*script, "stop"], capture_output=True, timeout=120, check=False)


# --- the cluster and the deployments -------------------------------------------------------------


def _start_nodes(nodes: RayNodes) -> None:
    """Head + workers ``a`` and ``b``, one at a time, as the cluster tests' fixture starts them."""
    nodes.start_head()
    # One at a time: on a busy 2-core machine a raylet may miss Ray's fixed 30 s to register.
    nodes.add_worker("a", resources={"stratagem-a": 1, "stratagem-worker": 1})
    nodes.wait_for_nodes(2)
    nodes.add_worker("b", resources={"stratagem-b": 1, "stratagem-worker": 1})
    nodes.wait_for_nodes(3)


@contextlib.contextmanager
def _running_nodes(nodes: RayNodes) -> Iterator[None]:
    """The nodes started; stopped on the way out, their folder removed if they had started."""
    logger.info("cluster: starting a Ray head and workers a and b under %s", nodes.folder)
    started = time.perf_counter()
    try:
        _start_nodes(nodes)
    except BaseException:
        nodes.stop()
        logger.info("cluster: the Ray nodes did not start; their logs are in %s", nodes.folder)
        raise
    logger.info("cluster: 3 nodes up in %.0f s", time.perf_counter() - started)
    try:
        yield
    finally:
        nodes.stop()
        shutil.rmtree(nodes.folder, ignore_errors=True)


@dataclass(slots=True)
class _Deployment:
    store: str
    stratagem: Stratagem
    endpoints: dict[str, str]
    credentials: Credentials | None
    placement: dict[str, str]


def _deploy(store: str, stratagem: Stratagem) -> _Deployment:
    """``stratagem up``, then ``status``: the endpoints, and which node each agent landed on."""
    logger.info("cluster: stratagem up (%s store)", store)
    stratagem.json("up", timeout=300)
    status = stratagem.json("status")
    agents = {agent["role"]: agent for agent in status["agents"]}
    sick = [role for role, agent in agents.items() if agent["health"] != "serving"]
    if sick:
        raise RuntimeError(f"{store}: not serving after up: {sick}")
    return _Deployment(
        store=store,
        stratagem=stratagem,
        endpoints={role: agent["endpoint"] for role, agent in agents.items()},
        credentials=stratagem.credentials(),
        placement={
            role: agent["node_labels"].get("stratagem/node", "?") for role, agent in agents.items()
        },
    )


# --- the goals ---------------------------------------------------------------------------------


_TAGS: Final = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliett",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)


def goal_in_own_world(request: SubmitGoalRequest, worker: int) -> SubmitGoalRequest:
    """``request`` with every entity its passage names renamed for ``worker``.

    The perception agent keeps one world for all goals, and a goal's last step applies its actions
    to it: two goals about the same characters at once would move them under each other (the later
    one then fails its precondition check, as it should). So each worker pursues the goal in a
    world of its own: character names take the worker's word (``Mira``: ``Mira Bravo``), and
    the head noun of every noun phrase takes it as a suffix (``the iron key``: ``the iron
    keybravo``; ``the key`` still names it). Worker 0's word is ``alpha``.
    """
    if not 0 <= worker < len(_TAGS):
        raise ValueError(f"worker must be in [0, {len(_TAGS)})")
    tag = _TAGS[worker]
    names: set[str] = set()
    for sentence in re.split(r"(?<=[.!?])\s+", request.passage):
        for pattern in DEFAULT_PATTERNS:
            found = pattern.compiled().fullmatch(sentence.strip().rstrip(".!?"))
            if found is not None:
                names.update(value for value in found.groupdict().values() if value)
                break
    words: dict[str, str] = {}
    for name in names:
        if name[0].isupper():
            words[name] = f"{name} {tag.title()}"
        else:
            head = name.split()[-1]
            words[head] = f"{head}{tag}"
    if not words:
        return request
    found_word = re.compile(
        r"\b(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")\b"
    )

    def rename(text: str) -> str:
        return found_word.sub(lambda match: words[match.group(0)], text)

    return request.model_copy(
        update={"goal": rename(request.goal), "passage": rename(request.passage)}
    )


async def _goal(
    deployment: _Deployment, request: SubmitGoalRequest, timeout_s: float
) -> tuple[float, str]:
    """One goal; its latency and ``""`` when it succeeded, else why not."""
    started = time.perf_counter()
    try:
        outcome = await run_goal(
            deployment.endpoints,
            request,
            timeout_s=timeout_s,
            credentials=deployment.credentials,
        )
    except Exception as exc:  # a failed goal is a result to report
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"[:300]
    elapsed = time.perf_counter() - started
    status = outcome.response.status
    return elapsed, "" if status == "succeeded" else f"status {status}"


async def _closed_loop(
    deployment: _Deployment, level: int, goals: int, prefix: str, timeout_s: float
) -> GoalSamples:
    """``goals`` goals by ``level`` workers, each starting its next goal when its last answered."""
    samples = GoalSamples()
    numbers = iter(range(goals))

    async def worker(index: int) -> None:
        goal = goal_in_own_world(DEMO_GOAL, index)
        for number in numbers:
            # Distinct plan ids keep concurrent goals apart: the orchestrator derives its
            # cross-agent request ids (the agents' idempotency keys) from the plan id and step.
            request = goal.model_copy(update={"plan_id": f"{prefix}-{number}"})
            latency, failure = await _goal(deployment, request, timeout_s)
            samples.latencies_s.append(latency)
            if failure:
                samples.failures.append(f"{request.plan_id}: {failure}")

    cpu_before, client_before = _cpu_ticks(), time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker(index) for index in range(level)))
    samples.wall_s = time.perf_counter() - started
    samples.client_cpu_s = time.process_time() - client_before
    samples.busy_cores = _busy_cores(cpu_before, _cpu_ticks(), os.cpu_count() or 1)
    return samples


async def _measure(
    deployments: Sequence[_Deployment], config: ClusterBenchConfig, run: str
) -> dict[str, dict[int, GoalSamples]]:
    found: dict[str, dict[int, GoalSamples]] = {d.store: {} for d in deployments}
    most = config.levels[-1]
    for deployment in deployments:
        # Every worker's world into the perception agent's world first, so that every level runs
        # against the same world (its size is not a variable of the comparison).
        logger.info("cluster: %s: %d worlds, one goal each", deployment.store, most)
        primed = await _closed_loop(
            deployment, most, most, f"bench-{run}-{deployment.store}-p", config.goal_timeout_s
        )
        if primed.failures:
            raise RuntimeError(f"{deployment.store}: goals failed: {primed.failures[:3]}")
    for index, level in enumerate(config.levels):
        # Alternate the stores' order so neither always runs first (or always after the other).
        order = deployments if index % 2 == 0 else list(reversed(deployments))
        for deployment in order:
            prefix = f"bench-{run}-{deployment.store}-{level}"
            warmup = min(config.warmup, level)
            logger.info(
                "cluster: %s, %d in flight: %d warm-up goals", deployment.store, level, warmup
            )
            await _closed_loop(deployment, warmup, warmup, f"{prefix}-w", config.goal_timeout_s)
            goals = config.goals[level]
            samples = await _closed_loop(
                deployment, level, goals, f"{prefix}-t", config.goal_timeout_s
            )
            found[deployment.store][level] = samples
            logger.info(
                "cluster: %s, %d in flight: %d goals in %.1f s (%.2f goals/s), median %.0f ms, "
                "%d failed",
                deployment.store,
                level,
                goals,
                samples.wall_s,
                goals / samples.wall_s,
                statistics.median(samples.latencies_s) * 1e3,
                len(samples.failures),
            )
    return found


def run_cluster_benchmark(config: ClusterBenchConfig | None = None) -> dict[str, Any]:
    """Start the cluster, deploy both stores, measure, take everything down again.

    On the way out, also on error and in this order: ``stratagem down`` for each deployment,
    every Ray node started here stopped by PID, the database dropped, and the PostgreSQL server
    stopped when it was started here. The Ray nodes' folder is removed unless they failed to start
    (its logs are kept then, and named).

    Args:
        config: Levels and goal counts; ``ClusterBenchConfig()`` by default.

    Returns:
        A JSON-ready dict: ``summarize_cluster``'s, plus ``placement`` (per store, each role's
        node) and ``postgres_started_here``.
    """
    config = config or ClusterBenchConfig()
    run = uuid.uuid4().hex[:8]
    # Short: Ray keeps Unix sockets below it, whose paths may not exceed 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="sgb-", dir="/tmp"))
    nodes = RayNodes(folder)
    urls: dict[str, str | None] = dict.fromkeys(config.stores)
    postgres_started = False
    with contextlib.ExitStack() as stack:
        if POSTGRESQL in config.stores:
            urls[POSTGRESQL], postgres_started = stack.enter_context(_postgres_database())
        stack.enter_context(_running_nodes(nodes))
        deployments = []
        for store in config.stores:
            settings: dict[str, Any] = {"placement": PLACEMENT}
            if urls[store]:
                settings["store_url"] = urls[store]
            stratagem = stratagem_on(
                nodes, folder / f"state-{store}", f"bench-{store}-{run}", **settings
            )
            stack.callback(_down, stratagem)
            deployments.append(_deploy(store, stratagem))
        samples = asyncio.run(_measure(deployments, config, run))
    result = summarize_cluster(config, samples)
    result["placement"] = {d.store: d.placement for d in deployments}
    result["postgres_started_here"] = postgres_started
    return result


def _down(stratagem: Stratagem) -> None:
    done = stratagem.run("down", "--json", timeout=240)
    if done.returncode != 0:
        logger.info("cluster: stratagem down failed: %s", done.stderr.strip()[-500:])


# --- the summary -------------------------------------------------------------------------------


def _latency_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(latencies_s) * 1e3, 1),
        "p90": round(percentile(latencies_s, 90) * 1e3, 1),
        "p99": round(percentile(latencies_s, 99) * 1e3, 1),
        "min": round(min(latencies_s) * 1e3, 1),
        "max": round(max(latencies_s) * 1e3, 1),
        "mean": round(statistics.fmean(latencies_s) * 1e3, 1),
        "n": len(latencies_s),
    }


def summarize_cluster(
    config: ClusterBenchConfig, samples: dict[str, dict[int, GoalSamples]]
) -> dict[str, Any]:
    """The figures of every store and level, and each level's latency against the first level's.

    Returns:
        ``config``; ``stores``: per store, per level (as a string key): ``goals``, ``wall_s``,
        ``goals_per_s``, ``latency_ms`` (median, p90, p99, min, max, mean, n), ``failed`` and the
        first ``failures``, ``busy_cores`` (machine-wide, over the wall time),
        ``client_cpu_s_per_goal`` (this process), and ``vs_first_level`` (median and p90 latency,
        goals per second, each over the first level's).
    """
    stores: dict[str, dict[str, Any]] = {}
    for store, levels in samples.items():
        figures: dict[str, Any] = {}
        base: dict[str, Any] | None = None
        for level in config.levels:
            item = levels[level]
            goals = len(item.latencies_s)
            latency = _latency_ms(item.latencies_s)
            entry: dict[str, Any] = {
                "in_flight": level,
                "goals": goals,
                "wall_s": round(item.wall_s, 2),
                "goals_per_s": round(goals / item.wall_s, 2),
                "latency_ms": latency,
                "failed": len(item.failures),
                "failures": item.failures[:5],
                "busy_cores": None if item.busy_cores is None else round(item.busy_cores, 2),
                "client_cpu_s_per_goal": round(item.client_cpu_s / goals, 4),
            }
            base = base or entry
            entry["vs_first_level"] = {
                "median_latency": round(latency["median"] / base["latency_ms"]["median"], 2),
                "p90_latency": round(latency["p90"] / base["latency_ms"]["p90"], 2),
                "goals_per_s": round(entry["goals_per_s"] / base["goals_per_s"], 2),
            }
            figures[str(level)] = entry
        stores[store] = figures
    return {
        "config": {**asdict(config), "goal": DEMO_GOAL.goal, "beats": DEMO_GOAL.beats},
        "stores": stores,
    }
