"""Answers a server keeps by (caller, request_id), so a repeated request gets the same answer.

A cross-agent step keeps its ``request_id`` on every attempt and across a restart of its caller, so
the target answers a repeated request from this store and its handler does not run twice. With
``SqliteAnswerStore`` that holds across a restart of the *target* too: the answer is committed
before it is sent. A request id reused for a different payload is told apart by the stored
request digest (the server answers ``FAILED_PRECONDITION``).

Retention is bounded by count and by age (``AnswerRetention``); the oldest answers go first. A
request repeated after its answer was dropped runs its handler again, so the age should exceed the
longest time a caller may retry or resume a step.

Both stores are used from one event loop. The SQLite one (``journal_mode=WAL``,
``synchronous=NORMAL``: a killed process loses no committed answer) reads and commits an answer on
the loop itself, through a connection that never waits for a lock: a read in WAL mode does not wait
for writers, and a commit without an fsync costs some 30 µs, less than a hop to a thread and back.
Only when another connection holds the write lock (a prune, or another process) does that one
statement go to the store's own thread, which also opens, prunes, checkpoints and closes the file
(the loop's connection never checkpoints, so no fsync runs on the loop).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar, runtime_checkable

from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "AnswerRetention",
    "AnswerStore",
    "InMemoryAnswerStore",
    "SqliteAnswerStore",
    "StoredAnswer",
]

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
# Expired and surplus answers are dropped on every this-many puts (and when a store opens).
_PRUNE_EVERY: Final = 256


@dataclass(frozen=True, slots=True)
class AnswerRetention:
    """How many answers a store keeps, and for how long.

    Attributes:
        max_entries: The most answers kept; the oldest go first (0 keeps none).
        max_age_s: Answers older than this are dropped.
        max_bytes: The most answer bytes kept (the in-memory store only).
    """

    max_entries: int = 100_000
    max_age_s: float = 7 * 24 * 3600.0
    max_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_entries < 0:
            raise ProtocolUsageError("AnswerRetention.max_entries must be >= 0")
        if self.max_age_s <= 0 or self.max_bytes <= 0:
            raise ProtocolUsageError("AnswerRetention.max_age_s and max_bytes must be positive")


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """One stored answer.

    Attributes:
        request_digest: The digest of the request it answered.
        answer: The encoded response.
        stored_at: When it was stored (seconds since the epoch).
    """

    request_digest: str
    answer: bytes
    stored_at: float


@runtime_checkable
class AnswerStore(Protocol):
    """Successful answers by (caller, request_id)."""

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer stored for this caller's request id, if it is still kept."""
        ...

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Store an answer; it is durable (for a durable store) when this returns."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources."""
        ...


class InMemoryAnswerStore:
    """Answers in memory, bounded by count, bytes and age; lost with the process.

    Args:
        retention: The bounds; ``AnswerRetention()`` by default.
        clock: Seconds since the epoch (inject one in tests).
    """

    def __init__(
        self, retention: AnswerRetention | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], StoredAnswer] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``)."""
        key = (caller, request_id)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.stored_at < self._clock() - self._retention.max_age_s:
            self._drop(key)
            return None
        return entry

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Keep an answer, dropping the oldest beyond the bounds (see ``AnswerStore.put``)."""
        retention = self._retention
        if retention.max_entries == 0 or len(answer) > retention.max_bytes:
            return
        key = (caller, request_id)
        self._drop(key)
        self._entries[key] = StoredAnswer(request_digest, answer, self._clock())
        self._bytes += len(answer)
        horizon = self._clock() - retention.max_age_s
        while self._entries and (
            len(self._entries) > retention.max_entries
            or self._bytes > retention.max_bytes
            or next(iter(self._entries.values())).stored_at < horizon
        ):
            self._drop(next(iter(self._entries)))

    async def aclose(self) -> None:
        """Forget every answer."""
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry.answer)


_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS answers (
        caller TEXT NOT NULL,
        request_id TEXT NOT NULL,
        request_digest TEXT NOT NULL,
        answer BLOB NOT NULL,
        stored_at REAL NOT NULL,
        PRIMARY KEY (caller, request_id)
    )""",
    "CREATE INDEX IF NOT EXISTS answers_by_age ON answers (stored_at)",
)


class SqliteAnswerStore:
    """Answers in a SQLite file (WAL, ``synchronous=NORMAL``), kept across restarts.

    Args:
        path: The database file; its folder is created when missing.
        retention: The bounds (count and age; ``max_bytes`` is not applied here).
        clock: Seconds since the epoch (inject one in tests).

    Raises:
        ProtocolUsageError: When the file holds answers of another schema version.
    """

    def __init__(
        self,
        path: str | Path,
        retention: AnswerRetention | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._puts = 0
        # The store's thread: opening, pruning, checkpoints, and a statement the lock held up.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="answers")
        self._db: sqlite3.Connection | None = None
        self._loop_db: sqlite3.Connection | None = None
        try:
            self._thread.submit(self._open).result()
            # The event loop's connection: no busy wait (timeout 0), no automatic checkpoint.
            self._loop_db = sqlite3.connect(
                self._path, timeout=0, isolation_level=None, check_same_thread=False
            )
            self._loop_db.execute("PRAGMA synchronous=NORMAL")
            self._loop_db.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            if self._db is not None:
                self._thread.submit(self._db.close).result()
            self._thread.shutdown(wait=True)
            raise

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def _open(self) -> None:
        db = sqlite3.connect(self._path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                db.execute(statement)
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                db.execute("ROLLBACK")
                raise ProtocolUsageError(
                    f"answer store {self._path} has schema version {row[0]}; "
                    f"this build reads version {SCHEMA_VERSION}"
                )
            db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        self._db = db
        self._prune()

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        if self._db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return await asyncio.wrap_future(self._thread.submit(fn))

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return self._db

    def _loop_conn(self) -> sqlite3.Connection:
        if self._loop_db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return self._loop_db

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``)."""
        horizon = self._clock() - self._retention.max_age_s

        def read(db: sqlite3.Connection) -> StoredAnswer | None:
            row = db.execute(
                "SELECT request_digest, answer, stored_at FROM answers "
                "WHERE caller = ? AND request_id = ? AND stored_at >= ?",
                (caller, request_id, horizon),
            ).fetchone()
            return None if row is None else StoredAnswer(str(row[0]), bytes(row[1]), float(row[2]))

        try:
            return read(self._loop_conn())
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
        return await self._on_thread(lambda: read(self._conn()))

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Commit an answer; every ``_PRUNE_EVERY`` puts, drop what retention no longer keeps."""
        if self._retention.max_entries == 0:
            return
        self._puts += 1
        prune = self._puts % _PRUNE_EVERY == 0
        stored_at = self._clock()

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO answers "
                "(caller, request_id, request_digest, answer, stored_at) VALUES (?, ?, ?, ?, ?)",
                (caller, request_id, request_digest, answer, stored_at),
            )

        try:
            write(self._loop_conn())  # autocommit: committed when this returns
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
            await self._on_thread(lambda: write(self._conn()))
        if prune:
            await self._on_thread(self._prune_and_checkpoint)

    def _prune_and_checkpoint(self) -> None:
        """On the store's thread: prune, then move the WAL's pages into the database file."""
        self._prune()
        self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def prune(self) -> int:
        """Drop expired answers and the oldest beyond ``max_entries`` now; returns how many."""
        return await self._on_thread(self._prune)

    async def count(self) -> int:
        """How many answers are stored."""
        return await self._on_thread(
            lambda: int(self._conn().execute("SELECT COUNT(*) FROM answers").fetchone()[0])
        )

    def _prune(self) -> int:
        db = self._conn()
        horizon = self._clock() - self._retention.max_age_s
        db.execute("BEGIN IMMEDIATE")
        try:
            dropped = db.execute("DELETE FROM answers WHERE stored_at < ?", (horizon,)).rowcount
            dropped += db.execute(
                "DELETE FROM answers WHERE rowid IN (SELECT rowid FROM answers "
                "ORDER BY stored_at DESC LIMIT -1 OFFSET ?)",
                (self._retention.max_entries,),
            ).rowcount
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return int(dropped)

    async def aclose(self) -> None:
        """Close the file; later calls raise ``ProtocolUsageError``."""
        if self._db is None:
            return

        if self._loop_db is not None:
            self._loop_db.close()
            self._loop_db = None

        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.wrap_future(self._thread.submit(close))
        self._thread.shutdown(wait=True)

    async def __aenter__(self) -> SqliteAnswerStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds a lock (try again, waiting)."""
    return getattr(exc, "sqlite_errorcode", None) in {5, 6} or "locked" in str(exc)
