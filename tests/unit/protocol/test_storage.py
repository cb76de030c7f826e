"""The storage base: the one migration runner (SQLite files, PostgreSQL schemas), the error family
and its translation at the seam, and the store-owned worker thread."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stratagem.planning import (
    PlanningError,
    StoreCorruptError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
)
from stratagem.planning._errors import STORE_ERRORS
from stratagem.protocol import (
    ProtocolError,
    ProtocolUsageError,
    StorageCorruptError,
    StorageError,
    StorageSchemaError,
    StorageUnavailableError,
)
from stratagem.protocol._storage import StoreWorker, run_now
from stratagem.protocol._storage import _sqlite as sqlite_base

# --- the error family ---------------------------------------------------------------------------


def test_the_family_and_planning_s_store_errors_are_one_tree() -> None:
    for cls in (StorageSchemaError, StorageUnavailableError, StorageCorruptError):
        assert issubclass(cls, StorageError)
    assert issubclass(StorageError, ProtocolError)
    assert issubclass(StorageSchemaError, ProtocolUsageError)  # what protocol's stores raised
    for planning, storage in (
        (StoreError, StorageError),
        (StoreSchemaError, StorageSchemaError),
        (StoreUnavailableError, StorageUnavailableError),
        (StoreCorruptError, StorageCorruptError),
    ):
        assert issubclass(planning, storage)
        assert issubclass(planning, StoreError)
        assert issubclass(planning, PlanningError)
    error = STORE_ERRORS.schema("newer", location="here", found=9, known=3)
    assert isinstance(error, StoreSchemaError)
    assert (error.location, error.found, error.known, str(error)) == ("here", 9, 3, "newer")
    assert isinstance(STORE_ERRORS.of("unavailable", "busy", "here"), StoreUnavailableError)
    assert isinstance(STORE_ERRORS.of("corrupt", "bad", "here"), StoreCorruptError)
    assert type(STORE_ERRORS.of("error", "no", "here")) is StoreError


# --- the migration runner on SQLite -------------------------------------------------------------


def _create(table: str) -> Callable[[sqlite3.Connection], None]:
    def migration(conn: sqlite3.Connection) -> None:
        conn.execute(f"CREATE TABLE {table} (x INTEGER)")

    return migration


def _open(path: Path) -> sqlite3.Connection:
    return sqlite_base.connect(path, timeout_s=5.0)


def test_migrations_run_once_in_order_and_record_the_version(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "store.sqlite3"
    conn = _open(path)  # the folder is made
    migrations = [_create("one"), _create("two")]
    try:
        assert sqlite_base.migrate_file(conn, "c", migrations, location="f", what="store") == 2
        assert sqlite_base.migrate_file(conn, "c", migrations, location="f", what="store") == 2
        more = [*migrations, _create("three")]
        assert sqlite_base.migrate_file(conn, "c", more, location="f", what="store") == 3
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"one", "two", "three", "schema_version"} <= tables
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(3,)]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_a_newer_version_is_refused_with_the_store_s_classes(tmp_path: Path) -> None:
    conn = _open(tmp_path / "store.sqlite3")
    try:
        sqlite_base.migrate_file(conn, "c", [_create("one")], location="f", what="store")
        conn.execute("UPDATE schema_version SET version = 7")
        with pytest.raises(StorageSchemaError, match="schema version 7, newer than") as info:
            sqlite_base.migrate_file(conn, "c", [_create("one")], location="f", what="store")
        assert (info.value.found, info.value.known) == (7, 1)
        with pytest.raises(StoreSchemaError, match="use another state directory"):
            sqlite_base.migrate_file(
                conn, "c", [_create("one")], location="f", what="store", errors=STORE_ERRORS
            )
    finally:
        conn.close()


def test_a_failed_migration_keeps_nothing_of_it(tmp_path: Path) -> None:
    conn = _open(tmp_path / "store.sqlite3")
    try:
        sqlite_base.migrate_file(conn, "c", [_create("one")], location="f", what="store")

        def broken(conn: sqlite3.Connection) -> None:
            conn.execute("CREATE TABLE half (x INTEGER)")
            conn.execute("ALTER TABLE nowhere ADD COLUMN y TEXT")

        with pytest.raises(StorageSchemaError, match="cannot migrate the store f") as info:
            sqlite_base.migrate_file(
                conn, "c", [_create("one"), broken], location="f", what="store"
            )
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
    finally:
        conn.close()


def test_run_now_refuses_a_coroutine_that_suspends() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())


# --- SQLite errors translated at the seam -------------------------------------------------------


def test_a_file_that_is_not_a_database_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"this is not a database, it only has a name like one" * 100)
    with pytest.raises(StorageCorruptError, match="cannot open") as info:
        _open(path)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert info.value.location == str(path)
    with pytest.raises(StoreCorruptError):
        sqlite_base.connect(path, timeout_s=1.0, errors=STORE_ERRORS)


def test_a_lock_held_elsewhere_is_busy_then_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    conn = sqlite_base.connect(path, timeout_s=0)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE t (x INTEGER)")
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as raw, sqlite_base.transaction(conn):
            pass
        assert sqlite_base.is_busy(raw.value)
        error = sqlite_base.storage_error("write", str(path), raw.value)
        assert isinstance(error, StorageUnavailableError)
        assert str(error).startswith(f"cannot write in {path}: database is locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
        conn.close()


def test_a_file_that_cannot_be_made_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StorageUnavailableError, match="cannot open") as info:
        _open(blocker / "store.sqlite3")  # its folder would be a file
    assert isinstance(info.value.__cause__, OSError)


def test_a_transaction_rolls_back_what_raised(tmp_path: Path) -> None:
    conn = _open(tmp_path / "store.sqlite3")
    try:
        conn.execute("CREATE TABLE t (x INTEGER)")

        def insert_then_fail() -> None:
            with sqlite_base.transaction(conn):
                conn.execute("INSERT INTO t VALUES (1)")
                raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            insert_then_fail()
        with sqlite_base.transaction(conn):
            conn.execute("INSERT INTO t VALUES (2)")
        assert conn.execute("SELECT x FROM t").fetchall() == [(2,)]
    finally:
        conn.close()


# --- the worker ---------------------------------------------------------------------------------


async def test_the_worker_runs_jobs_in_order_on_its_one_thread() -> None:
    worker = StoreWorker("test-worker")
    assert worker.thread is None  # started on first use
    seen: list[tuple[int, str]] = []

    def job(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * 2

    try:
        results = await asyncio.gather(*(worker.call(job, n) for n in range(20)))
        assert results == [n * 2 for n in range(20)]
        assert [n for n, _ in seen] == list(range(20))
        assert {name for _, name in seen} == {"test-worker"}
        assert await asyncio.to_thread(worker.call_blocking, job, 21) == 42

        def fails() -> None:
            raise KeyError("gone")

        with pytest.raises(KeyError, match="gone"):
            await worker.call(fails)
        with pytest.raises(KeyError, match="gone"):
            await asyncio.to_thread(worker.call_blocking, fails)
    finally:
        worker.stop()
    assert worker.thread is None


def test_a_posted_job_is_not_waited_for_and_its_error_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = StoreWorker("test-poster")
    done = threading.Event()
    order: list[str] = []

    def fails() -> None:
        order.append("fails")
        raise RuntimeError("boom")

    def next_job() -> None:
        order.append("next")
        done.set()

    worker.post(fails)
    worker.post(next_job)
    assert done.wait(30)
    with caplog.at_level(logging.ERROR):
        worker.stop()  # joins: the log record is in by now
    assert order == ["fails", "next"]
    assert "test-poster: a job failed" in caplog.text


def test_stop_runs_the_jobs_given_before_it_and_a_later_job_starts_a_new_thread() -> None:
    worker = StoreWorker("test-stopper")
    gate = threading.Event()
    ran: list[int] = []
    worker.post(gate.wait)
    for n in range(5):
        worker.post(lambda n=n: ran.append(n))
    first = worker.thread
    gate.set()
    worker.stop()
    assert ran == [0, 1, 2, 3, 4]
    assert first is not None
    assert not first.is_alive()
    assert worker.call_blocking(threading.current_thread) is not first
    worker.stop()


async def test_a_result_for_a_closed_loop_is_dropped() -> None:
    worker = StoreWorker("test-closed-loop")
    release = threading.Event()
    worker.post(release.wait)

    def run_and_close() -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(worker.call(lambda: 1))
        loop.run_until_complete(asyncio.sleep(0))  # the job is queued behind the gate
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        loop.close()

    await asyncio.to_thread(run_and_close)
    release.set()
    assert await worker.call(lambda: "still serving") == "still serving"
    worker.stop()


# --- PostgreSQL ---------------------------------------------------------------------------------


def _pg_migration(table: str) -> Callable[[Any, Any], Awaitable[None]]:
    async def migration(conn: psycopg.AsyncConnection[Any], schema: Any) -> None:
        from stratagem.protocol._storage._postgres import q

        await conn.execute(q(f"CREATE TABLE {{s}}.{table} (x INTEGER)", schema))

    return migration


@pytest.mark.postgres
async def test_postgres_components_share_a_schema_and_migrate_once(postgres_url: str) -> None:
    from stratagem.protocol._storage import _postgres as pg_base

    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        one = [_pg_migration("one_a"), _pg_migration("one_b")]
        assert await pg_base.migrate_schema(conn, "s", "one", one, location="l", what="x") == 2
        assert await pg_base.migrate_schema(conn, "s", "one", one, location="l", what="x") == 2
        two = [_pg_migration("two_a")]
        assert await pg_base.migrate_schema(conn, "s", "two", two, location="l", what="x") == 1
        cursor = await conn.execute(
            "SELECT component, version FROM s.schema_versions ORDER BY component"
        )
        assert await cursor.fetchall() == [("one", 2), ("two", 1)]
        await conn.execute("UPDATE s.schema_versions SET version = 5 WHERE component = 'two'")
        with pytest.raises(StoreSchemaError, match=r"version 5, newer .* use another schema"):
            await pg_base.migrate_schema(
                conn, "s", "two", two, location="l", what="x", errors=STORE_ERRORS
            )


@pytest.mark.postgres
def test_postgres_blocking_migrations_use_the_same_runner(postgres_url: str) -> None:
    from psycopg import sql

    from stratagem.protocol._storage import _postgres as pg_base

    def create(conn: psycopg.Connection[tuple[object, ...]], schema: sql.Identifier) -> None:
        conn.execute(pg_base.q("CREATE TABLE {s}.t (x INTEGER)", schema))

    def broken(conn: psycopg.Connection[tuple[object, ...]], schema: sql.Identifier) -> None:
        conn.execute(pg_base.q("CREATE TABLE {s}.half (x INTEGER)", schema))
        conn.execute(pg_base.q("ALTER TABLE {s}.nowhere ADD COLUMN y TEXT", schema))

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert pg_base.migrate_blocking(conn, "b", "c", [create], location="l", what="x") == 1
        with pytest.raises(StorageSchemaError, match="cannot migrate the x l") as info:
            pg_base.migrate_blocking(conn, "b", "c", [create, broken], location="l", what="x")
        assert isinstance(info.value.__cause__, psycopg.Error)
        rows = conn.execute("SELECT to_regclass('b.half'), to_regclass('b.t')").fetchone()
        assert rows == (None, "b.t")


@pytest.mark.postgres
async def test_an_unreachable_server_is_unavailable_without_its_password() -> None:
    from stratagem.protocol._storage import _postgres as pg_base

    async def prepare(conn: object) -> None:
        raise AssertionError("never connected")

    pool = pg_base.PostgresPool(
        "postgresql://nobody:secret@127.0.0.1:1/none",
        schema="s",
        what="answer store",
        name="test",
        prepare=prepare,
        closed=lambda: ProtocolUsageError("closed"),
        timeout_s=1.0,
    )
    with pytest.raises(StorageUnavailableError, match="cannot open the answer store") as info:
        await pool.get()
    assert "secret" not in str(info.value)
    assert info.value.location == "postgresql://nobody@127.0.0.1:1/none (schema s)"
    await pool.aclose()
    with pytest.raises(ProtocolUsageError, match="closed"):
        await pool.get()


def test_opening_waits_for_another_connections_lock_to_switch_to_wal(tmp_path: Path) -> None:
    """The agents of a deployment open their shared audit file at once: one of them was refused
    "database is locked" at start (CI). Opening now waits for the lock to go, even with a
    statement timeout of 0, where SQLite calls no busy handler."""
    from stratagem.protocol._storage._sqlite import connect

    path = tmp_path / "shared.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")  # a file in rollback-journal mode, as a new one is
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        conn = connect(path, timeout_s=0)
    finally:
        release.join()
        holder.close()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
