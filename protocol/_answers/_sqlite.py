"""``SqliteAnswerStore``: answers in a SQLite file, kept across restarts of the target.

The store (``journal_mode=WAL``, ``synchronous=NORMAL``: a killed process loses no committed
answer) is used from one event loop. It reads and commits an answer on the loop itself, through a
connection that never waits for a lock: a read in WAL mode does not wait for writers, and a commit
without an fsync costs some 30 µs, less than a hop to a thread and back. Only when another
connection holds the write lock (a prune, or another process) does that one statement go to the
store's ``StoreWorker``, which also opens, prunes, checkpoints and closes the file (the loop's
connection never checkpoints, so no fsync runs on the loop).

Schema (version 1, component ``answers``; the file's ``schema_version`` row)::

    answers(caller, request_id, request_digest, answer, stored_at)

The file, its migrations and the translation of ``sqlite3`` errors into ``StorageError`` are the
shared SQLite seam's (``protocol._storage._sqlite``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from stratagem.protocol._answers._store import AnswerRetention, StoredAnswer
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage import StorageError, StoreWorker
from stratagem.protocol._storage._sqlite import (
    connect,
    is_busy,
    migrate_file,
    storage_error,
    transaction,
)

__all__ = ["MIGRATIONS", "SqliteAnswerStore"]

T = TypeVar("T")

# Expired and surplus answers are dropped on every this-many puts (and when a store opens).
_PRUNE_EVERY: Final = 256


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE IF NOT EXISTS answers (
        caller TEXT NOT NULL,
        request_id TEXT NOT NULL,
        request_digest TEXT NOT NULL,
        answer BLOB NOT NULL,
        stored_at REAL NOT NULL,
        PRIMARY KEY (caller, request_id)
    )"""
    )
    conn.execute("CREATE INDEX IF NOT EXISTS answers_by_age ON answers (stored_at)")


MIGRATIONS: Final = [_migrate_v1]
"""The schema migrations, oldest first; migration ``i`` (from 0) brings the file to ``i + 1``."""


class SqliteAnswerStore:
    """Answers in a SQLite file (WAL, ``synchronous=NORMAL``), kept across restarts.

    Args:
        path: The database file; its folder is created when missing.
        retention: The bounds (count and age; ``max_bytes`` is not applied here).
        clock: Seconds since the epoch (inject one in tests).

    Raises:
        StorageSchemaError: When the file holds answers of a newer schema version (a
            ``ProtocolUsageError`` too).
        StorageError: When the file cannot be opened.
    """

    def __init__(
        self,
        path: str | Path,
        retention: AnswerRetention | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = Path(path)
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._puts = 0
        # The store's thread: opening, pruning, checkpoints, and a statement the lock held up.
        self._worker = StoreWorker("answers")
        self._db: sqlite3.Connection | None = None
        self._loop_db: sqlite3.Connection | None = None
        try:
            self._worker.call_blocking(self._open)
            # The event loop's connection: no busy wait (timeout 0), no automatic checkpoint.
            self._loop_db = connect(self._path, timeout_s=0, checkpoints=False)
        except BaseException:
            if self._db is not None:
                self._worker.call_blocking(self._db.close)
            self._worker.stop()
            raise

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def _open(self) -> None:
        db = connect(self._path, timeout_s=30.0)
        try:
            migrate_file(db, "answers", MIGRATIONS, location=str(self._path), what="answer store")
        except BaseException:
            db.close()
            raise
        self._db = db
        self._prune()

    def _error(self, action: str, exc: sqlite3.Error) -> StorageError:
        return storage_error(action, str(self._path), exc)

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        if self._db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return await self._worker.call(fn)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return self._db

    def _loop_conn(self) -> sqlite3.Connection:
        if self._loop_db is None:
            raise ProtocolUsageError(f"the answer store {self._path} is closed")
        return self._loop_db

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``).

        Raises:
            StorageError: When the file cannot be read.
        """
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
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise self._error("read an answer", exc) from exc
        try:
            return await self._on_thread(lambda: read(self._conn()))
        except sqlite3.Error as exc:
            raise self._error("read an answer", exc) from exc

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Commit an answer; every ``_PRUNE_EVERY`` puts, drop what retention no longer keeps.

        Raises:
            StorageError: When the answer cannot be committed.
        """
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
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise self._error("store an answer", exc) from exc
            try:
                await self._on_thread(lambda: write(self._conn()))
            except sqlite3.Error as exc:
                raise self._error("store an answer", exc) from exc
        if prune:
            await self._on_thread(self._prune_and_checkpoint)

    def _prune_and_checkpoint(self) -> None:
        """On the store's thread: prune, then move the WAL's pages into the database file."""
        self._prune()
        try:
            self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            raise self._error("checkpoint the answers", exc) from exc

    async def prune(self) -> int:
        """Drop expired answers and the oldest beyond ``max_entries`` now; returns how many."""
        return await self._on_thread(self._prune)

    async def count(self) -> int:
        """How many answers are stored."""

        def count() -> int:
            try:
                return int(self._conn().execute("SELECT COUNT(*) FROM answers").fetchone()[0])
            except sqlite3.Error as exc:
                raise self._error("count the answers", exc) from exc

        return await self._on_thread(count)

    def _prune(self) -> int:
        db = self._conn()
        horizon = self._clock() - self._retention.max_age_s
        try:
            with transaction(db):
                dropped = db.execute("DELETE FROM answers WHERE stored_at < ?", (horizon,)).rowcount
                dropped += db.execute(
                    "DELETE FROM answers WHERE rowid IN (SELECT rowid FROM answers "
                    "ORDER BY stored_at DESC LIMIT -1 OFFSET ?)",
                    (self._retention.max_entries,),
                ).rowcount
        except sqlite3.Error as exc:
            raise self._error("prune the answers", exc) from exc
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

        await self._worker.call(close)
        self._worker.stop()

    async def __aenter__(self) -> SqliteAnswerStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
