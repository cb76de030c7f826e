"""``SqliteAuditLog``: the audit log in a SQLite file, shared safely by threads and processes.

``SqliteAuditLog`` is safe to share between threads and processes: each transaction reads the
previous hash and writes its records inside one ``BEGIN IMMEDIATE`` transaction, so records of
several processes on one file still form one chain. ``append`` blocks; async code awaits
``append_async`` instead. Each caller's await returns once the transaction holding its record has
committed (or raises when it failed, so a caller that must not proceed without its record fails
closed), and the records appended meanwhile share that transaction (group commit):

* with ``synchronous="normal"`` the records appended during one turn of the event loop are
  committed on the loop itself, in one transaction, right after that turn (a commit that reaches
  the operating system without an fsync costs some 40 µs: less than handing the record to a thread
  and back). Only when another connection holds the write lock at that moment (another agent
  process writing the same file) does the batch go to the log's writer thread, which waits for the
  lock without blocking the loop. The loop's connection never checkpoints the WAL itself (the fsync
  a checkpoint makes stays off the loop): every ``_CHECKPOINT_EVERY`` commits the writer thread
  checkpoints it.
* with ``synchronous="full"`` every batch goes to the writer thread (an fsync per commit does not
  belong on an event loop).

Durability of ``SqliteAuditLog`` (the file is in WAL mode; ``synchronous`` picks the trade-off):

* ``"normal"`` (the default): a commit reaches the operating system before ``append`` or
  ``append_async`` returns, but is fsynced only at WAL checkpoints. A crash of the process (a killed
  or failing agent actor) loses nothing committed; a crash of the operating system or a power loss
  may lose the last commits (the chain stays intact: it ends earlier). Commits cost a write, not an
  fsync.
* ``"full"``: every commit is fsynced before it returns, so it survives an operating-system crash or
  power loss too, at the cost of one fsync per transaction (shared by every record of a group
  commit). The runtime chooses it with ``STRATAGEM_AUDIT_SYNC=full``.

Schema (version 1, component ``audit``; the file's ``schema_version`` row)::

    audit(seq, ts, actor, action, target, capability, request_id, code, detail, digest,
          prev_hash, hash)                  append-only: triggers refuse UPDATE and DELETE

The file, its migrations (``MIGRATIONS``) and the translation of ``sqlite3`` errors into
``StorageError`` are the shared SQLite seam's (``protocol._storage._sqlite``); the writer thread
is the log's ``StoreWorker`` (``_group``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

from stratagem.protocol._audit._group import (
    _GroupCommitLog,
    _Pending,
    _report,
    _running_loop,
)
from stratagem.protocol._audit._log import (
    _COLUMNS,
    GENESIS,
    AuditRecord,
    _chain,
    _Entry,
    _entry,
)
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage import StorageError
from stratagem.protocol._storage._sqlite import (
    connect,
    is_busy,
    migrate_file,
    storage_error,
    transaction,
)

__all__ = ["HOLD_S", "MIGRATIONS", "SqliteAuditLog", "Synchronous"]

logger = logging.getLogger(__name__)

Synchronous = Literal["normal", "full"]
"""How hard a ``SqliteAuditLog`` commit is pushed to disk (see the module docstring)."""

_INSERT: Final = (
    f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_SELECT_PAGE: Final = (
    f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?"
)
_SELECT_LAST: Final = "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
_SELECT_LAST_RECORD: Final = f"SELECT {', '.join(_COLUMNS)} FROM audit ORDER BY seq DESC LIMIT 1"
# Append-only for this code and anyone using the file by mistake; a deliberate tamperer can drop
# the triggers, which the hash chain then exposes. remove_through lifts the second for a moment.
_NO_UPDATE: Final = """CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""
_NO_DELETE: Final = """CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE IF NOT EXISTS audit (
        seq INTEGER PRIMARY KEY,
        ts TEXT NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        capability TEXT NOT NULL,
        request_id TEXT NOT NULL,
        code TEXT NOT NULL,
        detail TEXT NOT NULL,
        digest TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    )"""
    )
    conn.execute(_NO_UPDATE)
    conn.execute(_NO_DELETE)


MIGRATIONS: Final = [_migrate_v1]
"""The schema migrations, oldest first; migration ``i`` (from 0) brings the file to ``i + 1``."""

_SYNCHRONOUS: Final[dict[str, Literal["NORMAL", "FULL"]]] = {"normal": "NORMAL", "full": "FULL"}
# Commits on the event loop's connection between two WAL checkpoints by the writer thread (a commit
# adds a page or two to the WAL; SQLite's own automatic checkpoint is at 1,000 pages).
_CHECKPOINT_EVERY: Final = 500
HOLD_S: Final = 0.01
"""The longest a record handed to ``SqliteAuditLog.append_held`` waits for another record's
commit before it is committed on its own (seconds)."""


class SqliteAuditLog(_GroupCommitLog):
    """An audit log in a SQLite file (WAL), shared safely by threads and processes.

    Args:
        path: The database file; its folder is created when missing.
        synchronous: ``"normal"`` (the default: a committed record survives a crash of the
            process, the last ones may be lost to an operating-system crash or power loss) or
            ``"full"`` (an fsync per commit: committed records survive those too).

    Raises:
        ProtocolUsageError: When ``synchronous`` is neither ``"normal"`` nor ``"full"``.
        StorageSchemaError: When the file holds an audit log of a newer schema version (a
            ``ProtocolUsageError`` too).
        StorageError: When the file cannot be opened.
    """

    _PAGE = 1000

    def __init__(self, path: str | Path, *, synchronous: Synchronous = "normal") -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ProtocolUsageError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self._path = Path(path)
        self._synchronous: Synchronous = synchronous
        self._start_queue(str(self._path))
        # Private to its owner: SQLite makes its -wal and -shm files with the database's mode.
        self._db = connect(
            self._path, timeout_s=30.0, synchronous=_SYNCHRONOUS[synchronous], private=True
        )
        self._loop_db: sqlite3.Connection | None = None
        try:
            migrate_file(self._db, "audit", MIGRATIONS, location=self._label, what="audit log")
            if synchronous == "normal":
                # The event loop's connection: never waits for the write lock (busy timeout 0)
                # and never checkpoints (the writer thread does, every _CHECKPOINT_EVERY commits).
                self._loop_db = connect(self._path, timeout_s=0, checkpoints=False)
        except BaseException:
            self._db.close()
            raise
        self._loop_lock = threading.Lock()
        self._batch: list[_Pending] = []
        # A commit of the batch is scheduled after this turn; or, for held records only, a timer.
        self._flush_scheduled = False
        self._hold_timer: asyncio.TimerHandle | None = None
        self._loop_commits = 0

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def synchronous(self) -> Synchronous:
        """The durability chosen (see the module docstring)."""
        return self._synchronous

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so the previous hash read inside the
        # transaction is still the last one when the new records are written, across processes.
        with self._lock, self._translated(action), transaction(self._db) as db:
            yield db

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(action, exc) from exc

    def _error(self, action: str, exc: sqlite3.Error) -> StorageError:
        return storage_error(action, self._label, exc)

    def append_async(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> asyncio.Future[AuditRecord]:
        """Append like ``append`` without blocking the event loop (see the module docstring).

        Records appended during one turn of the loop are committed together right after it, on
        the loop, unless another connection holds the write lock (then the writer thread commits
        them). Once handed over, a record is written even when the awaiting task is cancelled.

        Returns:
            A future of the event loop that settles once the transaction holding the record has
            committed: the stored record, or the exception that kept it from being stored.

        Raises:
            ProtocolUsageError: When the log is closed.
        """
        return self._enqueue(
            _entry(actor, action, target, capability, request_id, code, detail, digest), hold=False
        )

    def append_held(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> asyncio.Future[AuditRecord]:
        """``append_async`` for a record that need not start a commit of its own.

        The record is chained in order with the others but waits for the next commit that
        another record starts (a call's ``call.accepted`` waits for its ``call.outcome``), or
        ``HOLD_S`` at most. A log that commits through its writer thread (``synchronous="full"``)
        takes it as ``append_async`` does.

        Returns:
            As ``append_async``.

        Raises:
            ProtocolUsageError: When the log is closed.
        """
        return self._enqueue(
            _entry(actor, action, target, capability, request_id, code, detail, digest), hold=True
        )

    def _enqueue(self, entry: _Entry, *, hold: bool) -> asyncio.Future[AuditRecord]:
        """Add ``entry`` to the loop's batch; a record not held schedules the batch's commit
        right after this turn, a held one (when nothing is scheduled) within ``HOLD_S``. With
        ``synchronous="full"`` every record goes to the writer thread."""
        if self._loop_db is None:
            return self._to_writer(entry)
        if self._closed:
            raise ProtocolUsageError(f"the audit log {self._label} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AuditRecord] = loop.create_future()
        with self._loop_lock:
            self._batch.append(_Pending(entry, loop, future))
            if self._flush_scheduled:
                return future
            if not hold:
                self._flush_scheduled = True
                if self._hold_timer is not None:
                    self._hold_timer.cancel()
                    self._hold_timer = None
            elif self._hold_timer is None:
                self._hold_timer = loop.call_later(HOLD_S, self._flush)
        if not hold:
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        """Commit the records appended since the last flush, on this thread when the write lock
        is free at once, else through the writer thread."""
        with self._loop_lock:
            batch, self._batch = self._batch, []
            self._flush_scheduled = False
            if self._hold_timer is not None:
                self._hold_timer.cancel()
                self._hold_timer = None
            if not batch:
                return
            outcomes: list[AuditRecord] | BaseException
            try:
                outcomes = self._commit_on_loop([pending.entry for pending in batch])
            except sqlite3.Error as exc:
                if is_busy(exc):
                    outcomes = []
                else:
                    error = self._error(f"write {len(batch)} audit records", exc)
                    error.__cause__ = exc
                    logger.error("%s", error)
                    outcomes = error
            except Exception as exc:
                logger.error(
                    "cannot write %d audit records to %s: %s", len(batch), self._label, exc
                )
                outcomes = exc
        if isinstance(outcomes, list) and not outcomes:
            for pending in batch:  # the lock was busy: the writer waits for it
                self._hand_to_writer(pending)
            return
        _report(batch, outcomes, _running_loop())

    def _commit_on_loop(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        """``_commit_many`` on the loop's connection, which fails at once when the lock is taken."""
        db = self._loop_db
        assert db is not None
        with transaction(db):
            records = _chain(entries, db.execute(_SELECT_LAST).fetchone())
            db.executemany(
                _INSERT, [tuple(getattr(record, name) for name in _COLUMNS) for record in records]
            )
        self._loop_commits += 1
        if self._loop_commits % _CHECKPOINT_EVERY == 0:
            self._worker.post(self._checkpoint)
        return records

    def _checkpoint(self) -> None:
        """In the writer thread: move the WAL's pages into the database (never blocks writers)."""
        try:
            with self._lock:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            logger.warning("cannot checkpoint the audit log %s: %s", self._label, exc)

    def _commit_many(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        """Chain and write ``entries`` in one transaction, in order."""
        with self._transaction(f"write {len(entries)} audit records") as db:
            records = _chain(entries, db.execute(_SELECT_LAST).fetchone())
            # A row per record, in column order (``dataclasses.astuple`` deep-copies every field).
            db.executemany(
                _INSERT, [tuple(getattr(record, name) for name in _COLUMNS) for record in records]
            )
        return records

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order, read a page at a time."""
        after = None
        while True:
            with self._lock, self._translated("read the audit records"):
                rows = self._db.execute(_SELECT_PAGE, (after, after, self._PAGE)).fetchall()
            for row in rows:
                yield AuditRecord(*row)
            if len(rows) < self._PAGE:
                return
            after = rows[-1][0]

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with self._lock, self._translated("read the audit head"):
            row = self._db.execute(_SELECT_LAST).fetchone()
        return str(row[1]) if row else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        with self._lock, self._translated("read the last audit record"):
            row = self._db.execute(_SELECT_LAST_RECORD).fetchone()
        return AuditRecord(*row) if row else None

    def remove_through(self, seq: int) -> int:
        """Delete the records up to ``seq`` (kept elsewhere: ``_archive``); the
        last record always stays, so the chain goes on from it. Returns how many were deleted.

        The append-only trigger is lifted for this one transaction, under the write lock.
        """
        with self._transaction(f"remove the audit records through {seq}") as db:
            last = db.execute(_SELECT_LAST).fetchone()
            if last is None:
                return 0
            through = min(seq, int(last[0]) - 1)
            db.execute("DROP TRIGGER audit_no_delete")
            removed = db.execute("DELETE FROM audit WHERE seq <= ?", (through,)).rowcount
            db.execute(_NO_DELETE)
        return int(removed)

    def close(self) -> None:
        """Write the records already handed to ``append_async``, then close the database."""
        self._closed = True
        self._flush()
        self._stop_writer()
        with self._lock:
            self._db.close()
        with self._loop_lock:
            if self._loop_db is not None:
                self._loop_db.close()

    def __enter__(self) -> SqliteAuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
