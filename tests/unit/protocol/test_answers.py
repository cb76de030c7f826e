"""Answer stores: bounded retention by count, bytes and age; the durable ones (SQLite, PostgreSQL)
survive a reopen."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from stratagem.protocol import (
    AnswerRetention,
    AnswerStore,
    InMemoryAnswerStore,
    PostgresAnswerStore,
    ProtocolUsageError,
    SqliteAnswerStore,
)

DurableStore = SqliteAnswerStore | PostgresAnswerStore
Open = Callable[..., DurableStore]


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_in_memory_store_evicts_the_oldest_by_count_and_by_bytes() -> None:
    store = InMemoryAnswerStore(AnswerRetention(max_entries=2, max_bytes=10))
    await store.put("a", "1", "d1", b"1234")
    await store.put("a", "2", "d2", b"1234")
    await store.put("a", "3", "d3", b"12")
    assert await store.get("a", "1") is None
    await store.put("a", "4", "d4", b"123456")  # 4 + 2 + 6 bytes is over 10: the oldest goes
    assert await store.get("a", "2") is None
    kept = await store.get("a", "3")
    assert kept is not None
    assert (kept.request_digest, kept.answer) == ("d3", b"12")
    await store.put("a", "5", "d5", b"x" * 11)  # larger than the whole store: not kept
    assert await store.get("a", "5") is None
    assert isinstance(store, AnswerStore)


async def test_in_memory_store_forgets_answers_older_than_the_age_limit() -> None:
    clock = _Clock()
    store = InMemoryAnswerStore(AnswerRetention(max_age_s=60), clock=clock)
    await store.put("a", "1", "d1", b"x")
    clock.now += 61
    assert await store.get("a", "1") is None
    assert len(store) == 0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Open:
    """``durable(retention=None, clock=...)``: a durable store, on the same file or schema each
    time it is called."""
    if request.param == "sqlite":

        def sqlite(retention: AnswerRetention | None = None, **options: object) -> DurableStore:
            path = tmp_path / "answers.sqlite3"
            return SqliteAnswerStore(path, retention, **options)  # type: ignore[arg-type]

        return sqlite
    url: str = request.getfixturevalue("postgres_url")

    def postgres(retention: AnswerRetention | None = None, **options: object) -> DurableStore:
        schema = "stratagem_perception"
        return PostgresAnswerStore(url, retention, schema=schema, **options)  # type: ignore[arg-type]

    return postgres


async def test_durable_store_keeps_answers_across_a_reopen(durable: Open) -> None:
    async with durable() as store:
        await store.put("orchestrator", "p@1:s1", "digest", b"\x00answer")
        await store.put("orchestrator", "p@1:s2", "first", b"1")
        await store.put("orchestrator", "p@1:s2", "second", b"2")  # the last answer wins
    async with durable() as store:
        kept = await store.get("orchestrator", "p@1:s1")
        assert kept is not None
        assert (kept.request_digest, kept.answer) == ("digest", b"\x00answer")
        assert await store.get("tactical", "p@1:s1") is None  # keyed by caller too
        replaced = await store.get("orchestrator", "p@1:s2")
        assert replaced is not None
        assert (replaced.request_digest, replaced.answer) == ("second", b"2")
        assert isinstance(store, AnswerStore)


def test_sqlite_store_is_wal(tmp_path: Path) -> None:
    path = tmp_path / "answers.sqlite3"
    SqliteAnswerStore(path)
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


async def test_durable_store_retention_by_count_and_age(durable: Open) -> None:
    clock = _Clock()
    retention = AnswerRetention(max_entries=3, max_age_s=100)
    async with durable(retention, clock=clock) as store:
        for i in range(5):
            clock.now += 1
            await store.put("a", str(i), f"d{i}", b"x")
        assert await store.prune() == 2
        assert await store.count() == 3
        assert await store.get("a", "0") is None
        assert await store.get("a", "4") is not None
        clock.now += 101
        assert await store.get("a", "4") is None  # expired answers are never served
        assert await store.prune() == 3


async def test_a_closed_durable_store_is_a_usage_error(durable: Open) -> None:
    store = durable()
    await store.aclose()
    with pytest.raises(ProtocolUsageError):
        await store.get("a", "1")


@pytest.mark.postgres
async def test_postgres_store_retention_by_bytes(postgres_url: str) -> None:
    clock = _Clock()
    retention = AnswerRetention(max_bytes=10)
    store = await PostgresAnswerStore.open(postgres_url, retention, schema="s", clock=clock)
    try:
        for i, answer in enumerate([b"1234", b"1234", b"12", b"123456"]):
            clock.now += 1
            await store.put("a", str(i), f"d{i}", answer)
        await store.put("a", "big", "d", b"x" * 11)  # larger than the whole store: not kept
        assert await store.prune() == 2  # 6 + 2 bytes fit; the two older answers do not
        assert [await store.get("a", key) is not None for key in ("0", "1", "2", "3", "big")] == [
            False,
            False,
            True,
            True,
            False,
        ]
    finally:
        await store.aclose()


@pytest.mark.postgres
async def test_postgres_stores_of_two_roles_share_a_database_not_answers(
    postgres_url: str,
) -> None:
    async with (
        PostgresAnswerStore(postgres_url, schema="stratagem_tactical") as tactical,
        PostgresAnswerStore(postgres_url, schema="stratagem_perception") as perception,
    ):
        await tactical.put("orchestrator", "r1", "d", b"tactical")
        assert await perception.get("orchestrator", "r1") is None
        assert await perception.count() == 0


@pytest.mark.postgres
async def test_postgres_store_refuses_another_schema_version(postgres_url: str) -> None:
    async with PostgresAnswerStore(postgres_url, schema="s"):
        pass
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE s.schema_versions SET version = 99 WHERE component = 'answers'")
    with pytest.raises(ProtocolUsageError, match="schema version 99"):
        await PostgresAnswerStore.open(postgres_url, schema="s")


def test_bad_retention_is_a_usage_error() -> None:
    with pytest.raises(ProtocolUsageError):
        AnswerRetention(max_entries=-1)
    with pytest.raises(ProtocolUsageError):
        AnswerRetention(max_age_s=0)


async def test_sqlite_answers_are_read_and_committed_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "answers.sqlite3"
    store = SqliteAnswerStore(path)
    try:

        async def no_thread(fn: object) -> None:
            raise AssertionError("a get or put without contention went to the store's thread")

        monkeypatch.setattr(store, "_on_thread", no_thread)
        await store.put("orchestrator", "r1", "digest", b"answer")
        kept = await store.get("orchestrator", "r1")
        assert kept is not None
        assert (kept.request_digest, kept.answer) == ("digest", b"answer")
        # Committed when put returned: another connection reads it at once.
        db = sqlite3.connect(path)
        try:
            assert db.execute("SELECT answer FROM answers").fetchall() == [(b"answer",)]
        finally:
            db.close()
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_a_held_write_lock_sends_the_put_to_the_stores_thread(tmp_path: Path) -> None:
    path = tmp_path / "answers.sqlite3"
    store = SqliteAnswerStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # a prune, or another process, is writing
        put = asyncio.ensure_future(store.put("orchestrator", "r1", "digest", b"answer"))
        await asyncio.sleep(0.2)  # the loop is not blocked while the put waits for the lock
        assert not put.done()
        assert await store.get("orchestrator", "r1") is None  # reads do not wait for writers
        other.execute("COMMIT")
        await asyncio.wait_for(put, 30)
        kept = await store.get("orchestrator", "r1")
        assert kept is not None
        assert kept.answer == b"answer"
    finally:
        other.close()
        await store.aclose()
