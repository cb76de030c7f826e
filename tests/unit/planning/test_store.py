"""State stores: round trip, the fold, migrations, pruning, linear growth (real SQLite files and a
real PostgreSQL server)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

import stratagem.planning._store._postgres as pg_store
import stratagem.planning._store._sqlite as sqlite_store
from stratagem.planning import (
    BreakerState,
    CompensationRecord,
    CompensationStatus,
    ControlRecord,
    FailureClass,
    GateDecision,
    GateKind,
    GateRecord,
    InMemoryStateStore,
    Plan,
    PlanStatus,
    PlanStatusRecord,
    PostgresStateStore,
    Record,
    RevisionDiff,
    RevisionRecord,
    SqliteStateStore,
    StateStore,
    StepIntent,
    StepResult,
    StepStatus,
    StoreError,
    StoreSchemaError,
    ToolStep,
)

from ._support import make_plan, tool_step


@pytest.fixture(
    params=[
        "sqlite",
        "sqlite-threaded",
        "memory",
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StateStore]:
    if request.param.startswith("sqlite"):
        threaded = request.param == "sqlite-threaded"
        async with SqliteStateStore(tmp_path / "state.db", threaded=threaded) as sqlite:
            yield sqlite
    elif request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
        async with PostgresStateStore(url, schema="stratagem_test") as postgres:
            yield postgres
    else:
        yield InMemoryStateStore()


def journal(plan: Plan) -> list[Record]:
    pid, rev = plan.id, plan.revision
    return [
        PlanStatusRecord(pid, rev, PlanStatus.RUNNING),
        StepIntent(pid, rev, "a", 1),
        StepResult(pid, rev, "a", 1, StepStatus.RETRYING, None, FailureClass.TRANSIENT, "flaky"),
        StepIntent(pid, rev, "a", 2),
        StepResult(pid, rev, "a", 2, StepStatus.SUCCEEDED, '{"n": [1, 2]}'),
        CompensationRecord(pid, rev, "a", CompensationStatus.NEEDED),
        StepIntent(pid, rev, "b", 1),
        GateRecord(pid, rev, "g", GateDecision.OPEN, GateKind.GATE, prompt="ship it?"),
        GateRecord(
            pid, rev, "g", GateDecision.APPROVED, GateKind.GATE, approver="ann", rationale="ok"
        ),
        StepIntent(pid, rev, "c", 1),
        StepResult(pid, rev, "c", 1, StepStatus.FAILED, None, FailureClass.LOGIC, "bad input"),
        ControlRecord(pid, rev),
        PlanStatusRecord(pid, rev, PlanStatus.COMPENSATING, "undoing"),
        CompensationRecord(pid, rev, "a", CompensationStatus.RUNNING, 1),
    ]


def three_steps() -> Plan:
    return make_plan(tool_step("a"), tool_step("b"), tool_step("c", "a"))


async def test_round_trip_folds_the_journal(store: StateStore) -> None:
    plan = three_steps()
    assert await store.save_plan(plan) is True
    assert await store.save_plan(plan) is False  # written once
    await store.commit(journal(plan))
    state = await store.load("p1")
    assert state is not None
    assert state.plan(Plan) == plan
    assert (state.revision, state.status, state.message) == (1, PlanStatus.COMPENSATING, "undoing")
    assert state.records == 14
    assert state.steps["a"].status is StepStatus.SUCCEEDED
    assert (state.steps["a"].attempt, state.steps["a"].output) == (2, {"n": [1, 2]})
    assert state.steps["b"].in_flight
    assert state.steps["b"].attempt == 1
    assert state.steps["c"].failure_class is FailureClass.LOGIC
    assert state.steps["c"].message == "bad input"
    assert state.outputs == {"a": {"n": [1, 2]}}
    gate = state.gates["g"]
    assert (gate.decision, gate.approver, gate.rationale, gate.prompt) == (
        GateDecision.APPROVED,
        "ann",
        "ok",
        "ship it?",
    )
    assert [(c.step_id, c.status, c.attempt) for c in state.compensations] == [
        ("a", CompensationStatus.RUNNING, 1)
    ]
    assert state.cancel_requested is True
    assert await store.load("nope") is None


async def test_a_role_plan_loads_as_the_base_plan(store: StateStore) -> None:
    class StoryPlan(Plan):
        themes: list[str]

    plan = StoryPlan(id="s", owner="strategic", goal="g", themes=["loss"], steps=[])
    await store.save_plan(plan)
    state = await store.load("s")
    assert state is not None
    assert state.plan(StoryPlan).themes == ["loss"]
    assert state.plan(Plan).id == "s"


async def test_unfinished_and_prune(store: StateStore) -> None:
    for n, status in enumerate(
        [PlanStatus.SUCCEEDED, PlanStatus.RUNNING, PlanStatus.FAILED, PlanStatus.BLOCKED]
    ):
        plan = make_plan(tool_step("a")).model_copy(update={"id": f"p{n}"})
        await store.save_plan(plan)
        await store.commit([PlanStatusRecord(plan.id, 1, status)])
    assert await store.unfinished() == ["p1", "p3"]
    assert await store.prune(keep_last=1) == 1  # p0 (older finished); p2 kept as the last
    assert await store.load("p0") is None
    assert await store.load("p2") is not None
    assert await store.prune(before=time.time() - 3600) == 0  # nothing that old
    assert await store.prune() == 1
    assert await store.unfinished() == ["p1", "p3"]  # unfinished plans are never pruned
    assert (await store.stats()).plans == 2


async def test_a_commit_for_an_unsaved_plan_stores_nothing(store: StateStore) -> None:
    plan = three_steps()
    await store.save_plan(plan)
    with pytest.raises(StoreError):
        await store.commit([StepIntent("p1", 1, "a", 1), StepIntent("ghost", 1, "a", 1)])
    state = await store.load("p1")
    assert state is not None
    assert state.records == 0


async def test_revisions_breakers_and_journals_round_trip(store: StateStore) -> None:
    plan = three_steps()
    await store.save_plan(plan)
    await store.commit([PlanStatusRecord("p1", 1, PlanStatus.RUNNING, trace_context="")])
    second = plan.model_copy(update={"revision": 2})
    record = RevisionRecord(
        "p1", 2, 1, "retry b", "operator:ann", RevisionDiff(added=["d"]), ["a"], at=123.5
    )
    carried = [StepResult("p1", 2, "a", 1, StepStatus.SUCCEEDED, '{"x": 1}')]
    await store.save_revision(second, record, carried)
    with pytest.raises(StoreError):
        await store.save_revision(second, record, carried)  # a revision is written once
    history = await store.revisions("p1")
    assert [(r.revision, r.parent) for r in history] == [(1, None), (2, 1)]
    assert history[1] == record
    assert await store.journal("p1") == carried  # the newest revision by default
    assert len(await store.journal("p1", 1)) == 1
    assert await store.journal("nope") == []
    state = await store.load("p1")
    assert state is not None
    assert (state.revision, state.outputs) == (2, {"a": {"x": 1}})
    await store.save_breaker(BreakerState("search", 3, 99.25))
    await store.save_breaker(BreakerState("search", 0, None))
    await store.save_breaker(BreakerState("fetch", 1, None))
    assert sorted(await store.breakers(), key=lambda b: b.tool) == [
        BreakerState("fetch", 1, None),
        BreakerState("search", 0, None),
    ]


async def test_a_revision_loads_and_a_gates_record_keeps_what_it_asked_and_answered(
    store: StateStore,
) -> None:
    plan = three_steps()
    await store.save_plan(plan)
    await store.save_revision(
        plan.model_copy(update={"revision": 2}), RevisionRecord("p1", 2, 1, "why", "ann"), []
    )
    await store.commit(
        [
            GateRecord(
                "p1",
                2,
                "g",
                GateDecision.OPEN,
                GateKind.TOOL,
                prompt="charge?",
                at=10.5,
                arguments_json='{"amount": 5}',
                deadline=70.5,
                escalate_at=40.5,
                deciders=("ann", "role:leads"),
            ),
            GateRecord(
                "p1",
                2,
                "g",
                GateDecision.OPEN,
                GateKind.TOOL,
                at=40.5,
                deadline=70.5,
                deciders=("bo",),
                escalated=True,
            ),
            GateRecord(
                "p1",
                2,
                "g",
                GateDecision.APPROVED,
                GateKind.TOOL,
                approver="bo",
                arguments_json='{"amount": 3}',
                value_json='"x"',
            ),
        ]
    )
    first = await store.load("p1", 1)
    assert first is not None
    assert (first.revision, first.gates) == (1, {})
    assert await store.load("p1", 3) is None
    state = await store.load("p1")
    assert state is not None
    gate = state.gates["g"]
    assert (gate.kind, gate.decision, gate.approver, gate.prompt) == (
        GateKind.TOOL,
        GateDecision.APPROVED,
        "bo",
        "charge?",
    )
    assert (gate.arguments, gate.edited, gate.value, gate.has_value) == (
        {"amount": 3},
        True,
        "x",
        True,
    )
    assert (gate.deadline, gate.deciders, gate.escalated, gate.opened_at) == (
        70.5,
        ("bo",),
        True,
        40.5,
    )
    records = [r for r in await store.journal("p1") if isinstance(r, GateRecord)]
    assert records[0].deciders == ("ann", "role:leads")
    assert (records[0].escalate_at, records[1].escalated) == (40.5, True)


async def test_sqlite_is_wal_with_normal_sync_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    plan = three_steps()
    async with SqliteStateStore(path) as store:
        await store.save_plan(plan)
        await store.commit(journal(plan))
        assert await store.schema_version() == len(sqlite_store.MIGRATIONS)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    async with SqliteStateStore(path) as again:
        state = await again.load("p1")
    assert state is not None
    assert state.records == 14


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        await store.save_plan(three_steps())
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreSchemaError, match="schema version 99, newer than this code") as info:
        await SqliteStateStore(path).start()
    assert (info.value.found, info.value.known) == (99, len(sqlite_store.MIGRATIONS))


async def test_migrations_run_in_order_and_keep_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    known = list(sqlite_store.MIGRATIONS)
    # A store as the version-1 code left it: its schema, and a plan row written by that code.
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    known[0](conn)
    conn.execute("INSERT INTO schema_version (version) VALUES (1)")
    conn.execute(
        "INSERT INTO plans (plan_id, revision, plan_type, plan_json, status, created, updated) "
        "VALUES ('p1', 1, 'stratagem.planning._plan.Plan', ?, 'pending', 0, 0)",
        (three_steps().model_dump_json(),),
    )
    conn.commit()
    conn.close()

    def extra(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE plans ADD COLUMN note TEXT DEFAULT 'migrated'")

    monkeypatch.setattr(sqlite_store, "MIGRATIONS", [*known, extra])
    async with SqliteStateStore(path) as store:
        assert await store.schema_version() == len(known) + 1
        state = await store.load("p1")  # v3 moved the plan's JSON to plan_bodies
        assert state is not None
        assert state.plan_json == three_steps().model_dump_json()
        assert [r.revision for r in await store.revisions("p1")] == [1]  # v2's tables exist
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT note FROM plans").fetchone()[0] == "migrated"
    conn.close()


async def test_a_failing_migration_leaves_the_old_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    async with SqliteStateStore(path) as store:
        await store.save_plan(three_steps())

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE nowhere ADD COLUMN x TEXT")

    monkeypatch.setattr(sqlite_store, "MIGRATIONS", [*sqlite_store.MIGRATIONS, broken])
    with pytest.raises(StoreSchemaError, match="cannot migrate"):
        await SqliteStateStore(path).start()
    monkeypatch.undo()
    async with SqliteStateStore(path) as store:
        assert await store.schema_version() == len(sqlite_store.MIGRATIONS)


async def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    await store.start()
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.load("p1")


async def _store_size(store: SqliteStateStore | PostgresStateStore, steps: int) -> tuple[int, int]:
    plan = Plan(
        id=f"grow-{steps}",
        owner="perception",
        goal="grow",
        steps=[ToolStep(id=f"s{n}", tool="noop", input={"n": n}) for n in range(steps)],
    )
    async with store:
        empty = (await store.stats()).bytes
        await store.save_plan(plan)
        pid = plan.id
        for start in range(0, steps, 50):  # one commit per "tick" of 50 steps
            records: list[Record] = []
            for n in range(start, min(steps, start + 50)):
                records.append(StepIntent(pid, 1, f"s{n}", 1))
                output = f'{{"step": "s{n}", "value": {n}}}'
                records.append(StepResult(pid, 1, f"s{n}", 1, StepStatus.SUCCEEDED, output))
            await store.commit(records)
        stats = await store.stats()
    return stats.records, stats.bytes - empty


async def test_the_store_grows_linearly_with_the_steps(tmp_path: Path) -> None:
    rows_small, bytes_small = await _store_size(SqliteStateStore(tmp_path / "small.db"), 200)
    rows_large, bytes_large = await _store_size(SqliteStateStore(tmp_path / "large.db"), 2000)
    assert (rows_small, rows_large) == (400, 4000)
    ratio = bytes_large / bytes_small
    assert 7 < ratio < 13, ratio  # ~10x for 10x the steps: deltas, not snapshots (100x)


# --- PostgreSQL ---------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_postgres_grows_linearly_with_the_steps(postgres_url: str) -> None:
    # Pages, free-space maps and index roots make the size of a small table mostly overhead, so
    # compare the growth of the two halves of one run: deltas grow alike, snapshots 3x.
    steps = 2000
    plan = Plan(
        id="grow",
        owner="perception",
        goal="grow",
        steps=[ToolStep(id=f"s{n}", tool="noop", input={"n": n}) for n in range(steps)],
    )
    sizes = []
    async with PostgresStateStore(postgres_url, schema="s") as store:
        await store.save_plan(plan)
        for start in range(0, steps, 50):
            if start in (0, steps // 2):
                sizes.append((await store.stats()).bytes)
            records: list[Record] = []
            for n in range(start, start + 50):
                records.append(StepIntent(plan.id, 1, f"s{n}", 1))
                output = f'{{"step": "s{n}", "value": {n}}}'
                records.append(StepResult(plan.id, 1, f"s{n}", 1, StepStatus.SUCCEEDED, output))
            await store.commit(records)
        stats = await store.stats()
    assert stats.records == 2 * steps
    first, second = sizes[1] - sizes[0], stats.bytes - sizes[1]
    assert 0.7 < second / first < 1.4, (first, second)


@pytest.mark.postgres
async def test_postgres_survives_reopening_and_keeps_roles_apart(postgres_url: str) -> None:
    plan = three_steps()
    async with PostgresStateStore(postgres_url, schema="stratagem_tactical") as store:
        await store.save_plan(plan)
        await store.commit(journal(plan))
        assert await store.schema_version() == len(pg_store.MIGRATIONS)
    again = await PostgresStateStore.open(postgres_url, schema="stratagem_tactical")
    try:
        state = await again.load("p1")
        assert state is not None
        assert state.records == 14
    finally:
        await again.aclose()
    # Another role's store in the same database sees none of it.
    async with PostgresStateStore(postgres_url, schema="stratagem_strategic") as other:
        assert await other.load("p1") is None
        assert await other.unfinished() == []
        assert (await other.stats()).records == 0
        assert await other.save_plan(plan) is True


@pytest.mark.postgres
async def test_postgres_stores_opened_at_once_migrate_once(postgres_url: str) -> None:
    stores = [PostgresStateStore(postgres_url, schema="shared") for _ in range(4)]
    await asyncio.gather(*(store.start() for store in stores))
    try:
        assert await stores[0].schema_version() == len(pg_store.MIGRATIONS)
        plan = three_steps()
        saved = await asyncio.gather(*(store.save_plan(plan) for store in stores))
        assert sorted(saved) == [False, False, False, True]  # one schema: one store
    finally:
        for store in stores:
            await store.aclose()


def _execute(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


@pytest.mark.postgres
async def test_postgres_refuses_a_newer_schema(postgres_url: str) -> None:
    async with PostgresStateStore(postgres_url, schema="s") as store:
        await store.save_plan(three_steps())
    _execute(postgres_url, "UPDATE s.schema_versions SET version = 99 WHERE component = 'plans'")
    with pytest.raises(StoreSchemaError, match="schema version 99, newer than this code") as info:
        await PostgresStateStore(postgres_url, schema="s").start()
    assert (info.value.found, info.value.known) == (99, len(pg_store.MIGRATIONS))


@pytest.mark.postgres
async def test_postgres_migrations_run_in_order_and_keep_data(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = list(pg_store.MIGRATIONS)
    async with PostgresStateStore(postgres_url, schema="s") as store:
        await store.save_plan(three_steps())

    async def extra(conn: psycopg.AsyncConnection[tuple[object, ...]], schema: object) -> None:
        await conn.execute("ALTER TABLE s.plans ADD COLUMN note TEXT DEFAULT 'migrated'")

    monkeypatch.setattr(pg_store, "MIGRATIONS", [*known, extra])
    async with PostgresStateStore(postgres_url, schema="s") as store:
        assert await store.schema_version() == len(known) + 1
        state = await store.load("p1")
        assert state is not None
        assert state.plan_json == three_steps().model_dump_json()
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT note FROM s.plans").fetchone()
    assert row == ("migrated",)


@pytest.mark.postgres
async def test_postgres_failing_migration_leaves_the_old_schema(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PostgresStateStore(postgres_url, schema="s") as store:
        await store.save_plan(three_steps())

    async def broken(conn: psycopg.AsyncConnection[tuple[object, ...]], schema: object) -> None:
        await conn.execute("ALTER TABLE s.plans ADD COLUMN half TEXT")
        await conn.execute("ALTER TABLE s.nowhere ADD COLUMN x TEXT")

    monkeypatch.setattr(pg_store, "MIGRATIONS", [*pg_store.MIGRATIONS, broken])
    with pytest.raises(StoreSchemaError, match="cannot migrate"):
        await PostgresStateStore(postgres_url, schema="s").start()
    monkeypatch.undo()
    async with PostgresStateStore(postgres_url, schema="s") as store:
        assert await store.schema_version() == len(pg_store.MIGRATIONS)
        assert await store.load("p1") is not None
    with psycopg.connect(postgres_url) as conn:  # the half-done migration was rolled back
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 's' AND table_name = 'plans'"
        ).fetchall()
    assert ("half",) not in columns


@pytest.mark.postgres
async def test_postgres_closed_store_and_unreachable_server(postgres_url: str) -> None:
    store = await PostgresStateStore.open(postgres_url, schema="s")
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.load("p1")
    nowhere = PostgresStateStore(
        "postgresql://nobody:secret@127.0.0.1:1/none", schema="s", timeout_s=1.0
    )
    with pytest.raises(StoreError, match="cannot open") as info:
        await nowhere.start()
    assert "secret" not in str(info.value)
    assert info.value.location == "postgresql://nobody@127.0.0.1:1/none (schema s)"
    await nowhere.aclose()


@pytest.mark.postgres
async def test_postgres_commits_are_applied_in_call_order(postgres_url: str) -> None:
    async with PostgresStateStore(postgres_url, schema="s", max_size=4) as store:
        plan = make_plan(*(tool_step(f"s{n}") for n in range(40)))
        await store.save_plan(plan)
        await asyncio.gather(
            *(store.commit([StepIntent(plan.id, 1, f"s{n}", 1)]) for n in range(40))
        )
        assert [r.step_id for r in await store.journal(plan.id) if isinstance(r, StepIntent)] == [
            f"s{n}" for n in range(40)
        ]
