"""Answer stores: bounded retention by count, bytes and age; the SQLite one survives a reopen."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from protocol import (
    AnswerRetention,
    AnswerStore,
    InMemoryAnswerStore,
    ProtocolUsageError,
    SqliteAnswerStore,
)


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


async def test_sqlite_store_keeps_answers_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "answers.sqlite3"
    async with SqliteAnswerStore(path) as store:
        await store.put("orchestrator", "p@1:s1", "digest", b"\x00answer")
    async with SqliteAnswerStore(path) as store:
        kept = await store.get("orchestrator", "p@1:s1")
        assert kept is not None
        assert (kept.request_digest, kept.answer) == ("digest", b"\x00answer")
        assert await store.get("tactical", "p@1:s1") is None  # keyed by caller too
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


async def test_sqlite_store_retention_by_count_and_age(tmp_path: Path) -> None:
    clock = _Clock()
    retention = AnswerRetention(max_entries=3, max_age_s=100)
    async with SqliteAnswerStore(tmp_path / "a.sqlite3", retention, clock=clock) as store:
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


async def test_a_closed_sqlite_store_is_a_usage_error(tmp_path: Path) -> None:
    store = SqliteAnswerStore(tmp_path / "a.sqlite3")
    await store.aclose()
    with pytest.raises(ProtocolUsageError):
        await store.get("a", "1")


def test_bad_retention_is_a_usage_error() -> None:
    with pytest.raises(ProtocolUsageError):
        AnswerRetention(max_entries=-1)
    with pytest.raises(ProtocolUsageError):
        AnswerRetention(max_age_s=0)
