"""A store's history: one index row per plan, listed newest first with filters and keyset pages,
on every store (real SQLite files and a real PostgreSQL server), and the index filled for plans
stored before it existed."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

import stratagem.planning._store._postgres as pg_store
import stratagem.planning._store._sqlite as sqlite_store
from stratagem.planning import (
    FailureClass,
    HistoryQuery,
    InMemoryStateStore,
    Plan,
    PlanStatus,
    PlanStatusRecord,
    PostgresStateStore,
    RevisionDiff,
    RevisionRecord,
    SqliteStateStore,
    StateStore,
    StepIntent,
    StepResult,
    StepStatus,
)
from stratagem.planning._store._rows import decode_record, encode_record

from ._support import tool_step

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CONTEXT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.fixture(params=["sqlite", "memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StateStore]:
    if request.param == "sqlite":
        async with SqliteStateStore(tmp_path / "state.db") as sqlite:
            yield sqlite
    elif request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
        async with PostgresStateStore(url, schema="stratagem_test") as postgres:
            yield postgres
    else:
        yield InMemoryStateStore()


def plan(plan_id: str, goal: str = "find the crown", text: str = "Mira") -> Plan:
    return Plan(
        id=plan_id,
        owner="perception",
        goal=goal,
        steps=[tool_step("read", tool="extract_entities", input={"text": text})],
    )


async def ran(
    store: StateStore,
    item: Plan,
    status: PlanStatus,
    *,
    message: str = "",
    context: str = "",
    output: str = '{"entities": []}',
) -> None:
    """Store ``item`` and a run of it ending in ``status``."""
    await store.save_plan(item)
    pid, rev = item.id, item.revision
    result = (
        StepResult(pid, rev, "read", 1, StepStatus.SUCCEEDED, output)
        if status is PlanStatus.SUCCEEDED
        else StepResult(pid, rev, "read", 1, StepStatus.FAILED, None, FailureClass.LOGIC, message)
    )
    records = [
        PlanStatusRecord(pid, rev, PlanStatus.RUNNING, trace_context=context),
        StepIntent(pid, rev, "read", 1),
        result,
    ]
    if status.is_final:
        records.append(PlanStatusRecord(pid, rev, status, message))
    await store.commit(records)


async def ids(store: StateStore, **query: object) -> list[str]:
    return [s.plan_id for s in await store.history(HistoryQuery(**query))]  # type: ignore[arg-type]


async def test_plans_are_listed_newest_first_with_what_they_are(store: StateStore) -> None:
    before = time.time()
    await ran(store, plan("a"), PlanStatus.SUCCEEDED, context=CONTEXT)
    await ran(store, plan("b", goal="reach the tower"), PlanStatus.FAILED, message="no map")
    await store.save_plan(plan("c"))
    listed = await store.history(HistoryQuery())
    assert [s.plan_id for s in listed] == ["c", "b", "a"]
    c, b, a = listed
    assert (a.status, a.trace_id, a.goal, a.revision) == (
        PlanStatus.SUCCEEDED,
        TRACE,
        "find the crown",
        1,
    )
    assert (b.status, b.message, b.trace_id) == (PlanStatus.FAILED, "no map", "")
    assert c.status is PlanStatus.PENDING
    assert all(before <= s.created <= s.updated <= time.time() for s in listed)
    assert c.cursor > b.cursor > a.cursor


async def test_filters_narrow_the_list(store: StateStore) -> None:
    await ran(store, plan("goal-1", goal="Find the CROWN"), PlanStatus.SUCCEEDED, context=CONTEXT)
    await ran(
        store,
        plan("goal-1/extract", goal="extract", text="Oren sleeps"),
        PlanStatus.FAILED,
        message="entity_ids is empty",
    )
    await ran(store, plan("goal-10", goal="reach the tower"), PlanStatus.SUCCEEDED)
    await ran(store, plan("goal_2", goal="other"), PlanStatus.SUCCEEDED, output='{"who": "Zelda"}')
    # The plan and its sub-plans, the plan first; not goal-10, whose id only starts alike.
    assert await ids(store, plan_id="goal-1", oldest_first=True) == ["goal-1", "goal-1/extract"]
    assert await ids(store, plan_id="goal-1") == ["goal-1/extract", "goal-1"]
    # "_" in an id is no wildcard.
    assert await ids(store, plan_id="goal_2") == ["goal_2"]
    assert await ids(store, status=PlanStatus.FAILED) == ["goal-1/extract"]
    assert await ids(store, goal="crown") == ["goal-1"]  # case-insensitive
    assert await ids(store, trace_id=TRACE) == ["goal-1"]
    # Free text: the last message, the plan body (a step's input), the journal (an output).
    assert await ids(store, text="EMPTY") == ["goal-1/extract"]
    assert await ids(store, text="oren") == ["goal-1/extract"]
    assert await ids(store, text="zelda") == ["goal_2"]
    assert await ids(store, text="no such words") == []
    listed = await store.history(HistoryQuery())
    middle = sorted(s.created for s in listed)[1]
    assert len(await ids(store, since=middle)) == 3
    assert len(await ids(store, until=middle)) == 1
    assert await ids(store, since=middle, until=middle) == []


async def test_pages_follow_one_another_without_overlap(store: StateStore) -> None:
    for n in range(7):
        await ran(store, plan(f"p{n}"), PlanStatus.SUCCEEDED)
    seen: list[str] = []
    after = None
    while True:
        page = await store.history(HistoryQuery(after=after, limit=3))
        seen.extend(s.plan_id for s in page)
        if len(page) < 3:
            break
        after = page[-1].cursor
        # A plan created meanwhile is newer: it never shifts a later page.
        await store.save_plan(plan(f"new-{after}"))
    assert seen == [f"p{n}" for n in reversed(range(7))]
    # Oldest first, the same way (what a plan and its sub-plans are listed in).
    first = await store.history(HistoryQuery(oldest_first=True, limit=3))
    rest = await store.history(HistoryQuery(oldest_first=True, after=first[-1].cursor))
    assert [s.plan_id for s in first + rest][:7] == [f"p{n}" for n in range(7)]


async def test_a_new_revision_keeps_the_plans_place_and_resets_its_status(
    store: StateStore,
) -> None:
    first = plan("r")
    await ran(store, first, PlanStatus.FAILED, message="bad", context=CONTEXT)
    await ran(store, plan("s"), PlanStatus.SUCCEEDED)
    second = first.model_copy(update={"revision": 2, "goal": "find it again"})
    record = RevisionRecord("r", 2, 1, "retry", "operator", RevisionDiff((), (), ()), [])
    await store.save_revision(second, record, [])
    listed = await store.history(HistoryQuery())
    assert [s.plan_id for s in listed] == ["s", "r"]
    r = listed[1]
    assert (r.revision, r.status, r.message, r.goal) == (
        2,
        PlanStatus.PENDING,
        "",
        "find it again",
    )
    assert r.trace_id == TRACE  # the first traced run's
    await store.commit([PlanStatusRecord("r", 2, PlanStatus.SUCCEEDED, "")])
    assert (await store.history(HistoryQuery(plan_id="r")))[0].status is PlanStatus.SUCCEEDED


async def test_pruned_plans_leave_the_history(store: StateStore) -> None:
    await ran(store, plan("old"), PlanStatus.SUCCEEDED)
    await ran(store, plan("kept"), PlanStatus.SUCCEEDED)
    await store.save_plan(plan("unfinished"))
    assert await store.prune(keep_last=1) == 1
    assert await ids(store) == ["unfinished", "kept"]


async def test_step_times_round_trip(store: StateStore) -> None:
    item = plan("t")
    await store.save_plan(item)
    await store.commit(
        [
            StepIntent("t", 1, "read", 1, at=100.5),
            StepResult(
                "t", 1, "read", 1, StepStatus.RETRYING, None, FailureClass.TRANSIENT, at=101
            ),
            StepIntent("t", 1, "read", 2, cost=2.5, at=102.25),
            StepResult("t", 1, "read", 2, StepStatus.SUCCEEDED, "{}", at=103.75),
        ]
    )
    state = await store.load("t")
    assert state is not None
    step = state.steps["read"]
    assert (step.started, step.ended, step.attempt) == (100.5, 103.75, 2)
    intents = [r for r in await store.journal("t") if isinstance(r, StepIntent)]
    assert [(r.at, r.cost) for r in intents] == [(100.5, None), (102.25, 2.5)]


def test_rows_written_before_step_times_still_read() -> None:
    # Schema 3 kept an intent's cost alone (or nothing) and a result's failure without a time.
    intent = decode_record("p", 1, (2, "s", 1, None, None, "2.5"))
    assert isinstance(intent, StepIntent)
    assert (intent.cost, intent.at) == (2.5, 0.0)
    assert decode_record("p", 1, (2, "s", 1, None, None, None)) == StepIntent("p", 1, "s", 1)
    failed = decode_record("p", 1, (3, "s", 1, "failed", None, '["logic", "bad"]'))
    assert isinstance(failed, StepResult)
    assert (failed.failure_class, failed.message, failed.at) == (FailureClass.LOGIC, "bad", 0.0)
    done = decode_record("p", 1, (3, "s", 1, "succeeded", "{}", None))
    assert isinstance(done, StepResult)
    assert done.at == 0.0


def test_step_times_are_kept_in_whole_microseconds() -> None:
    # The two records every step writes format their time as an integer: a float's shortest
    # text (repr) was most of what a checkpointed step spent on its records.
    intent = encode_record(StepIntent("p", 1, "s", 1, at=1764345600.123456))
    assert intent[-1] == ",1764345600123456"
    costly = encode_record(StepIntent("p", 1, "s", 2, cost=2.5, at=1764345600.5))
    assert costly[-1] == "2.5,1764345600500000"
    done = encode_record(StepResult("p", 1, "s", 1, StepStatus.SUCCEEDED, "{}", at=1764345601.0))
    assert done[-1] == "1764345601000000"
    read = decode_record("p", 1, intent)
    assert isinstance(read, StepIntent)
    assert read.at == pytest.approx(1764345600.123456, abs=1e-6)
    read = decode_record("p", 1, costly)
    assert isinstance(read, StepIntent)
    assert (read.cost, read.at) == (2.5, 1764345600.5)
    read = decode_record("p", 1, done)
    assert isinstance(read, StepResult)
    assert read.at == 1764345601.0


def test_step_times_written_in_seconds_still_read() -> None:
    # Rows written before the times were kept in microseconds: seconds with a point.
    intent = decode_record("p", 1, (2, "s", 1, None, None, ",1764345600.25"))
    assert isinstance(intent, StepIntent)
    assert (intent.cost, intent.at) == (None, 1764345600.25)
    costly = decode_record("p", 1, (2, "s", 1, None, None, "2.5,1764345600.25"))
    assert isinstance(costly, StepIntent)
    assert (costly.cost, costly.at) == (2.5, 1764345600.25)
    done = decode_record("p", 1, (3, "s", 1, "succeeded", "{}", "1764345600.75"))
    assert isinstance(done, StepResult)
    assert done.at == 1764345600.75


def _stored_before_the_history(rows: list[tuple[str, Plan, list[object]]]) -> list[tuple]:
    """Rows as schema 3 code wrote them: (plan id, revision, plan JSON, events)."""
    out = []
    for plan_id, item, records in rows:
        out.append(
            (plan_id, item.revision, item.model_dump_json(), [encode_record(r) for r in records])
        )  # type: ignore[arg-type]
    return out


def _old_rows() -> list[tuple[str, Plan, list[object]]]:
    a, b = plan("a"), plan("b", goal="reach the tower")
    return [
        (
            "a",
            a,
            [
                PlanStatusRecord("a", 1, PlanStatus.RUNNING, at=10.0, trace_context=CONTEXT),
                PlanStatusRecord("a", 1, PlanStatus.FAILED, "step 'read' failed", at=11.0),
            ],
        ),
        ("b", b, [PlanStatusRecord("b", 1, PlanStatus.RUNNING, at=20.0)]),
    ]


async def test_sqlite_fills_the_history_of_plans_stored_before_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for migration in sqlite_store.MIGRATIONS[:3]:
        migration(conn)
    conn.execute("INSERT INTO schema_version (version) VALUES (3)")
    for created, (plan_id, revision, plan_json, events) in enumerate(
        _stored_before_the_history(_old_rows())
    ):
        rowid = conn.execute(
            "INSERT INTO plans (plan_id, revision, plan_type, status, created, updated) "
            "VALUES (?, ?, 'x', 'running', ?, ?)",
            (plan_id, revision, float(created), float(created)),
        ).lastrowid
        conn.execute("INSERT INTO plan_bodies (id, plan_json) VALUES (?, ?)", (rowid, plan_json))
        conn.executemany(
            "INSERT INTO events (plan, seq, kind, step_id, attempt, status, output, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(rowid, 10 * created + n, *row) for n, row in enumerate(events)],
        )
    conn.commit()
    conn.close()
    async with SqliteStateStore(path) as store:
        assert await store.schema_version() == len(sqlite_store.MIGRATIONS)
        await _assert_backfilled(store)


@pytest.mark.postgres
async def test_postgres_fills_the_history_of_plans_stored_before_it(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = list(pg_store.MIGRATIONS)
    monkeypatch.setattr(pg_store, "MIGRATIONS", known[:1])
    async with PostgresStateStore(postgres_url, schema="s"):
        pass  # schema 1: no plan_index yet
    with psycopg.connect(postgres_url) as conn:
        for created, (plan_id, revision, plan_json, events) in enumerate(
            _stored_before_the_history(_old_rows())
        ):
            row = conn.execute(
                "INSERT INTO s.plans (plan_id, revision, plan_type, status, created, updated) "
                "VALUES (%s, %s, 'x', 'running', %s, %s) RETURNING id",
                (plan_id, revision, float(created), float(created)),
            ).fetchone()
            assert row is not None
            conn.execute(
                "INSERT INTO s.plan_bodies (id, plan_json) VALUES (%s, %s)", (row[0], plan_json)
            )
            for event in events:
                conn.execute(
                    "INSERT INTO s.events (plan, kind, step_id, attempt, status, output, data) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (row[0], *event),
                )
    monkeypatch.setattr(pg_store, "MIGRATIONS", known)
    async with PostgresStateStore(postgres_url, schema="s") as store:
        assert await store.schema_version() == len(known)
        await _assert_backfilled(store)


async def _assert_backfilled(store: StateStore) -> None:
    listed = await store.history(HistoryQuery())
    assert [s.plan_id for s in listed] == ["b", "a"]
    b, a = listed
    assert (a.status, a.message, a.trace_id, a.goal) == (
        PlanStatus.FAILED,
        "step 'read' failed",
        TRACE,
        "find the crown",
    )
    assert (b.status, b.trace_id, b.goal) == (PlanStatus.RUNNING, "", "reach the tower")
    # And the index follows what is written from now on.
    await store.commit([PlanStatusRecord("b", 1, PlanStatus.SUCCEEDED, "", trace_context=CONTEXT)])
    assert await ids(store, trace_id=TRACE) == ["b", "a"]
