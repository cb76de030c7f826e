"""The history: one page of plans out of 10,000 stored, through the whole path the CLI takes.

Four agents (the built-in roles, each a bare ``agents.Agent`` with its own store) hold
``plans`` finished plans between them, each of ``steps`` tool steps with a journal as the engine
writes it (a run with a trace, each step's intent and result with a small output, a final status;
one plan in ten failed). The agents serve over real gRPC on 127.0.0.1 (``AgentServer``, the
shipped policy, token authentication, an in-memory audit log), and an ``Operator`` reads them as
``stratagem plans list`` and ``plans show`` do. Measured, each after warm-up runs:

* ``first_page``: ``Operator.history(page_size=50)`` across the four agents (newest first);
* ``next_page``: the page after it, from the first page's token;
* ``failed``: the first page of ``status="failed"``;
* ``text``: the first page of a free-text filter (``text=``) that only a few plans match: the
  stores scan plan bodies and journals for it, so this is the slow case, reported without a
  target;
* ``show``: ``Operator.plan`` of one plan, with every step's record;
* ``store_page``: ``StateStore.history`` of one store alone (no gRPC, no merge).

The stores are SQLite files (``sqlite``) and, when a server is reachable
(``STRATAGEM_TEST_PG_URL``, else ``scripts/postgres.sh``'s), schemas of a fresh PostgreSQL
database (``postgres``). The target (issue 24): one page of the listing, median, at most
``TARGET_MS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from stratagem.agents import Agent, ToolRegistry
from stratagem.planning import (
    FailureClass,
    HistoryQuery,
    Plan,
    PlanResult,
    PlanStatus,
    PlanStatusRecord,
    PostgresStateStore,
    SqliteStateStore,
    StateStore,
    StepIntent,
    StepResult,
    StepStatus,
    ToolStep,
)
from stratagem.protocol import (
    ROLES,
    AgentServer,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
    WireModel,
)
from stratagem.runtime import Operator, load_settings
from tests.bench.stats import summarize

__all__ = ["CASES", "TARGET_MS", "HistoryBenchConfig", "run_history_benchmark"]

TARGET_MS: Final = 200.0
"""Issue 24's target: one page of 10,000 stored plans in at most 200 ms (median)."""
CASES: Final = ("first_page", "next_page", "failed", "text", "show", "store_page")
_REPO: Final = Path(__file__).resolve().parents[2]
_TRACE: Final = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass(frozen=True, slots=True)
class HistoryBenchConfig:
    """How large and how long.

    Attributes:
        plans: Plans stored across the four agents.
        steps: Tool steps per plan.
        page_size: Plans per page.
        warmup: Untimed runs of each case.
        repeats: Timed runs of each case.
        postgres: Measure PostgreSQL stores too (when a server is reachable).
    """

    plans: int = 10_000
    steps: int = 5
    page_size: int = 50
    warmup: int = 3
    repeats: int = 30
    postgres: bool = True


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("the benchmark's agents serve their history only")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("the benchmark's agents serve their history only")


def _plan(plan_id: str, role: str, steps: int, number: int) -> Plan:
    text = "the lighthouse keeper" if number % 1000 == 7 else "Mira waits in the courtyard"
    return Plan(
        id=plan_id,
        owner=role,
        goal=f"goal {number}: find who leads",
        steps=[
            ToolStep(
                id=f"s{n}",
                tool="noop",
                input={"text": text, "n": n},
                depends_on=[f"s{n - 1}"] if n else [],
            )
            for n in range(steps)
        ],
    )


async def _fill(store: StateStore, role: str, count: int, steps: int, first: int) -> None:
    """``count`` finished plans of ``role``, as the engine journals them."""
    for number in range(first, first + count):
        plan = _plan(f"plan-{number:05d}", role, steps, number)
        await store.save_plan(plan)
        pid, rev = plan.id, plan.revision
        failed = number % 10 == 3
        records: list[Any] = [
            PlanStatusRecord(
                pid, rev, PlanStatus.RUNNING, trace_context=f"00-{_TRACE}-{number:016x}-01"
            )
        ]
        for n in range(steps):
            records.append(StepIntent(pid, rev, f"s{n}", 1))
            if failed and n == steps - 1:
                records.append(
                    StepResult(
                        pid, rev, f"s{n}", 1, StepStatus.FAILED, None, FailureClass.LOGIC, "no map"
                    )
                )
            else:
                output = f'{{"protagonist": "mira", "step": {n}, "themes": ["loss", "trust"]}}'
                records.append(StepResult(pid, rev, f"s{n}", 1, StepStatus.SUCCEEDED, output))
        final = PlanStatus.FAILED if failed else PlanStatus.SUCCEEDED
        message = f"step 's{steps - 1}' failed (logic): no map" if failed else ""
        records.append(PlanStatusRecord(pid, rev, final, message))
        await store.commit(records)


async def _time(run: Callable[[], Awaitable[object]], config: HistoryBenchConfig) -> list[float]:
    for _ in range(config.warmup):
        await run()
    samples = []
    for _ in range(config.repeats):
        started = time.perf_counter()
        await run()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


@contextlib.asynccontextmanager
async def _served(stores: dict[str, StateStore], state_dir: Path) -> AsyncIterator[Operator]:
    """The four agents on their stores, served over gRPC; an operator reading them."""
    settings = load_settings(
        state_dir=state_dir, auth="token", secret_file=state_dir / "cluster.secret", address=None
    )
    signer = TokenSigner(ClusterSecret.load_or_create(settings.secret_path))
    servers = []
    endpoints = {}
    agents = []
    for role, store in stores.items():
        agent = Agent(role, ToolRegistry(role), Plan, _NoPlanner(), store=store)
        server = AgentServer(
            agent,
            policy=Policy.default(),
            authenticator=TokenAuthenticator(signer),
            audit=InMemoryAuditLog(),
            config=ServerConfig(host="127.0.0.1", port=0),
        )
        await server.start()
        agents.append(agent)
        servers.append(server)
        endpoints[role] = server.endpoint
    try:
        async with Operator(settings=settings, endpoints=endpoints) as operator:
            yield operator
    finally:
        for server in servers:
            await server.aclose()
        for agent in agents:
            await agent.aclose()


async def _measure(
    stores: dict[str, StateStore], config: HistoryBenchConfig, state_dir: Path
) -> dict[str, Any]:
    share = config.plans // len(stores)
    filled = time.perf_counter()
    for index, (role, store) in enumerate(stores.items()):
        await _fill(store, role, share, config.steps, index * share)
    fill_s = time.perf_counter() - filled
    size = config.page_size
    async with _served(stores, state_dir) as op:
        first = await op.history(page_size=size)
        if len(first.plans) != size or not first.next_page_token:
            raise RuntimeError(f"the listing came back short: {len(first.plans)} plans")
        token = first.next_page_token
        middle = f"plan-{share // 2:05d}"
        one_store = next(iter(stores.values()))
        samples = {
            "first_page": await _time(lambda: op.history(page_size=size), config),
            "next_page": await _time(lambda: op.history(page_size=size, page_token=token), config),
            "failed": await _time(lambda: op.history(page_size=size, status="failed"), config),
            "text": await _time(lambda: op.history(page_size=size, text="lighthouse"), config),
            "show": await _time(lambda: op.plan(middle), config),
            "store_page": await _time(
                lambda: one_store.history(HistoryQuery(limit=size + 1)), config
            ),
        }
        found = await op.history(page_size=size, text="lighthouse")
    return {
        "fill_s": round(fill_s, 1),
        "text_matches": len(found.plans),
        "cases_ms": {case: summarize(values) for case, values in samples.items()},
    }


def _postgres_server() -> str | None:
    url = (
        os.environ.get("STRATAGEM_TEST_PG_URL")
        or subprocess.run(
            ["bash", str(_REPO / "scripts" / "postgres.sh"), "url"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
    if not url:
        return None
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error:
        return None
    return url


async def _sqlite(config: HistoryBenchConfig, folder: Path) -> dict[str, Any]:
    stores: dict[str, StateStore] = {}
    try:
        for role in ROLES:
            store = SqliteStateStore(folder / f"{role}.plans.sqlite3")
            await store.start()
            stores[role] = store
        return await _measure(stores, config, folder)
    finally:
        for store in stores.values():
            await store.aclose()


async def _postgres(config: HistoryBenchConfig, server: str, folder: Path) -> dict[str, Any]:
    name = f"stratagem_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    stores: dict[str, StateStore] = {}
    try:
        url = make_conninfo(server, dbname=name)
        for role in ROLES:
            stores[role] = await PostgresStateStore.open(url, schema=f"stratagem_{role}")
        return await _measure(stores, config, folder)
    finally:
        for store in stores.values():
            await store.aclose()
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def run_history_benchmark(config: HistoryBenchConfig | None = None) -> dict[str, Any]:
    """Measure the history's pages (see the module docstring); the results as plain data."""
    config = config or HistoryBenchConfig()
    stores: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="stratagem-bench-history-") as folder:
        stores["sqlite"] = asyncio.run(_sqlite(config, Path(folder) / "sqlite"))
        server = _postgres_server() if config.postgres else None
        if server is None:
            stores["postgres"] = {"skipped": "no PostgreSQL server was reachable"}
        else:
            (Path(folder) / "postgres").mkdir()
            stores["postgres"] = asyncio.run(_postgres(config, server, Path(folder) / "postgres"))
    targets = [
        {
            "store": store,
            "case": "first_page",
            "median_ms": figures["cases_ms"]["first_page"]["median"],
            "max_ms": TARGET_MS,
            "met": figures["cases_ms"]["first_page"]["median"] <= TARGET_MS,
        }
        for store, figures in stores.items()
        if "cases_ms" in figures
    ]
    return {
        "config": asdict(config),
        "stores": stores,
        "targets": targets,
        "met": all(target["met"] for target in targets),
    }
