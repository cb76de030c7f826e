"""The audit log: append-only, hash-chained, free of payloads and secrets.

Each record's ``hash`` is ``sha256(prev_hash + canonical JSON of the record without its hash)``,
where canonical JSON is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
and the first record's ``prev_hash`` is ``GENESIS``. Editing, deleting or reordering a record
therefore breaks the chain at that record, and ``verify_chain`` names the first one broken.
Removing records from the end shows only against a head kept elsewhere (``expected_head``).

A record holds the sha256 ``digest`` of a payload, never the payload, and a ``detail`` that is a
redacted one-line summary: whitespace collapsed, ``key=value`` secrets masked, length capped.

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

``InMemoryAuditLog.append_async`` appends on the spot: no thread, no suspension.

Durability of ``SqliteAuditLog`` (the file is in WAL mode; ``synchronous`` picks the trade-off):

* ``"normal"`` (the default): a commit reaches the operating system before ``append`` or
  ``append_async`` returns, but is fsynced only at WAL checkpoints. A crash of the process (a killed
  or failing agent actor) loses nothing committed; a crash of the operating system or a power loss
  may lose the last commits (the chain stays intact: it ends earlier). Commits cost a write, not an
  fsync.
* ``"full"``: every commit is fsynced before it returns, so it survives an operating-system crash or
  power loss too, at the cost of one fsync per transaction (shared by every record of a group
  commit). The runtime chooses it with ``STRATAGEM_AUDIT_SYNC=full``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring as _string
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Protocol, runtime_checkable

from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "GENESIS",
    "AsyncAuditLog",
    "AuditLog",
    "AuditRecord",
    "ChainVerdict",
    "InMemoryAuditLog",
    "SqliteAuditLog",
    "Synchronous",
    "digest",
    "redact",
    "verify_chain",
]

logger = logging.getLogger(__name__)

GENESIS: Final = "0" * 64
"""The ``prev_hash`` of the first record."""

SCHEMA_VERSION: Final = 1

Synchronous = Literal["normal", "full"]
"""How hard a ``SqliteAuditLog`` commit is pushed to disk (see the module docstring)."""

# A secret-looking key and its value ("password=x", "token: x", "Authorization: Bearer x").
_SECRET = re.compile(
    r"(?i)\b(password|passwd|secret|token|api[_-]?key|authorization|bearer|cookie)\b"
    r"(\s*[:=]\s*|\s+)(?:(?:bearer|basic)\s+)?\S+"
)
_TOKEN = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_.-]+")
# Text without whitespace, ':' or '=' is one line already and ``_SECRET`` cannot match it (a key
# must be followed by one of them): ids, names, codes and digests take this shortcut.
_PLAIN = re.compile(r"[^\s:=]*")
_DETAIL_LIMIT: Final = 240
_FIELD_LIMIT: Final = 128


def digest(data: bytes) -> str:
    """The hex sha256 of ``data``: what the audit log keeps instead of a payload."""
    return hashlib.sha256(data).hexdigest()


def _mask(match: re.Match[str]) -> str:
    return f"{match.group(1)}{match.group(2)}***"


def redact(text: str, limit: int = _DETAIL_LIMIT) -> str:
    """``text`` as one line: whitespace collapsed, ``key=value`` secrets masked, at most ``limit``.

    Args:
        text: Free text, e.g. an error message.
        limit: The maximum length of the result.

    Returns:
        The redacted line; ``password=hunter2`` becomes ``password=***`` and a signed token
        ``eyJ***``.
    """
    if _PLAIN.fullmatch(text) is not None:
        line = text
    else:
        line = _SECRET.sub(_mask, " ".join(text.split()))
    if "eyJ" in line:
        # A signed token (a JWT: ``protocol._identity``) is masked wherever it appears.
        line = _TOKEN.sub("eyJ***", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _canonical(fields: dict[str, object]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _chain_hash(
    prev_hash: str,
    seq: int,
    ts: str,
    actor: str,
    action: str,
    target: str,
    capability: str,
    request_id: str,
    code: str,
    detail: str,
    digest: str,
) -> str:
    """sha256(prev_hash + canonical JSON of the other fields), built without a dict.

    The same text as ``_canonical`` (keys in sorted order, each string as ``json.dumps`` writes it
    with ``ensure_ascii=False``) for the string fields and the int ``seq`` records hold; a record
    forged with values of other types takes ``_canonical`` itself.
    """
    canonical: str | None = None
    if type(seq) is int:
        try:
            canonical = (
                f'{{"action":{_string(action)},"actor":{_string(actor)},'
                f'"capability":{_string(capability)},"code":{_string(code)},'
                f'"detail":{_string(detail)},"digest":{_string(digest)},'
                f'"prev_hash":{_string(prev_hash)},"request_id":{_string(request_id)},'
                f'"seq":{seq!r},"target":{_string(target)},"ts":{_string(ts)}}}'
            )
        except TypeError:  # a field that is not a string
            canonical = None
    if canonical is None:
        fields: dict[str, object] = {
            "seq": seq,
            "ts": ts,
            "actor": actor,
            "action": action,
            "target": target,
            "capability": capability,
            "request_id": request_id,
            "code": code,
            "detail": detail,
            "digest": digest,
            "prev_hash": prev_hash,
        }
        canonical = _canonical(fields)
    return hashlib.sha256((prev_hash + canonical).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit record.

    Attributes:
        seq: Position in the log, from 1, without gaps.
        ts: When it was appended, ISO 8601 in UTC with microseconds.
        actor: Who acted: the caller's identity ("" when it sent none).
        action: What happened, e.g. ``call.accepted``, ``call.outcome``, ``call.denied``,
            ``call.refused``, ``call.replayed``.
        target: The agent acted upon.
        capability: The capability (or read RPC) involved.
        request_id: The request's idempotency key, when known.
        code: The status code name (``OK``, ``PERMISSION_DENIED``...), "" for ``call.accepted``.
        detail: A redacted one-line summary.
        digest: The sha256 of the payload involved (request or response bytes), "" when none.
        prev_hash: The previous record's ``hash`` (``GENESIS`` for the first).
        hash: sha256 of ``prev_hash`` + the canonical JSON of every other field.
    """

    seq: int
    ts: str
    actor: str
    action: str
    target: str
    capability: str
    request_id: str
    code: str
    detail: str
    digest: str
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        """The hash this record's contents call for (``hash``, unless it was tampered with)."""
        return _chain_hash(
            self.prev_hash,
            self.seq,
            self.ts,
            self.actor,
            self.action,
            self.target,
            self.capability,
            self.request_id,
            self.code,
            self.detail,
            self.digest,
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a caller appends: a record without its place in the chain."""

    actor: str
    action: str
    target: str
    capability: str
    request_id: str
    code: str
    detail: str
    digest: str

    def seal(self, seq: int, prev_hash: str) -> AuditRecord:
        ts = datetime.now(UTC).isoformat(timespec="microseconds")
        fields = (
            self.actor,
            self.action,
            self.target,
            self.capability,
            self.request_id,
            self.code,
            self.detail,
            self.digest,
        )
        return AuditRecord(seq, ts, *fields, prev_hash, _chain_hash(prev_hash, seq, ts, *fields))


def _entry(
    actor: str,
    action: str,
    target: str,
    capability: str,
    request_id: str,
    code: str,
    detail: str,
    digest: str,
) -> _Entry:
    """Every text field reduced to one line; ``detail`` redacted (see ``redact``)."""
    return _Entry(
        actor=redact(actor, _FIELD_LIMIT),
        action=redact(action, _FIELD_LIMIT),
        target=redact(target, _FIELD_LIMIT),
        capability=redact(capability, _FIELD_LIMIT),
        request_id=redact(request_id, 400),
        code=redact(code, _FIELD_LIMIT),
        detail=redact(detail),
        digest=redact(digest, _FIELD_LIMIT),
    )


class AuditLog(Protocol):
    """An append-only, hash-chained audit log (blocking; call it from a thread in async code)."""

    def append(
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
    ) -> AuditRecord:
        """Append a record, chained to the previous one; ``detail`` is redacted first."""
        ...

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order."""
        ...

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        ...


@runtime_checkable
class AsyncAuditLog(AuditLog, Protocol):
    """An ``AuditLog`` that async code can append to without blocking its event loop.

    ``AgentServer`` uses ``append_async`` when the log has it, and ``append`` in a worker thread
    otherwise.
    """

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
    ) -> Awaitable[AuditRecord]:
        """Append like ``append``; the await returns once the record is stored (durably)."""
        ...


class _ChainedLog:
    """``append`` for both stock logs; subclasses store a sealed record in ``_commit``."""

    def append(
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
    ) -> AuditRecord:
        """Append a record, chained to the previous one.

        Every text field is reduced to one line; ``detail`` is redacted (see ``redact``).

        Returns:
            The record as stored, with its ``seq``, ``ts`` and ``hash``.
        """
        entry = _entry(actor, action, target, capability, request_id, code, detail, digest)
        return self._commit(entry)

    def _commit(self, entry: _Entry) -> AuditRecord:
        raise NotImplementedError


class InMemoryAuditLog(_ChainedLog):
    """An audit log in a list: for tests and for runs that keep no state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[AuditRecord] = []

    async def append_async(
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
    ) -> AuditRecord:
        """``append``, on the spot: a list append needs no thread and never suspends."""
        return self.append(
            actor=actor,
            action=action,
            target=target,
            capability=capability,
            request_id=request_id,
            code=code,
            detail=detail,
            digest=digest,
        )

    def _commit(self, entry: _Entry) -> AuditRecord:
        with self._lock:
            last = self._records[-1] if self._records else None
            record = entry.seal(last.seq + 1 if last else 1, last.hash if last else GENESIS)
            self._records.append(record)
            return record

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order (a snapshot taken when called)."""
        with self._lock:
            return iter(list(self._records))

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with self._lock:
            return self._records[-1].hash if self._records else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        with self._lock:
            return self._records[-1] if self._records else None


_COLUMNS: Final = tuple(field.name for field in dataclasses.fields(AuditRecord))
_INSERT: Final = (
    f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_SELECT_PAGE: Final = (
    f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?"
)
_SELECT_LAST: Final = "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
_SELECT_LAST_RECORD: Final = f"SELECT {', '.join(_COLUMNS)} FROM audit ORDER BY seq DESC LIMIT 1"
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
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
    )""",
    # Append-only for this code and anyone using the file by mistake; a deliberate tamperer can
    # drop the triggers, which the hash chain then exposes.
    """CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
)
_SYNCHRONOUS: Final[dict[str, str]] = {"normal": "NORMAL", "full": "FULL"}
# The most records one group commit writes; more wait for the next transaction.
_MAX_BATCH: Final = 512
# Commits on the event loop's connection between two WAL checkpoints by the writer thread (a commit
# adds a page or two to the WAL; SQLite's own automatic checkpoint is at 1,000 pages).
_CHECKPOINT_EVERY: Final = 500


@dataclass(frozen=True, slots=True)
class _Pending:
    """A record handed to the writer thread, and where to report that it was committed."""

    entry: _Entry
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[AuditRecord]


def _resolve(
    outcomes: list[tuple[asyncio.Future[AuditRecord], AuditRecord | BaseException]],
) -> None:
    """Settle the futures of one batch (on their event loop); a cancelled waiter is skipped."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _chain(entries: Sequence[_Entry], last: tuple[int, str] | None) -> list[AuditRecord]:
    """Seal ``entries`` in order after the record ``last`` names (``(seq, hash)``, or none)."""
    seq, prev_hash = last if last else (0, GENESIS)
    records = []
    for entry in entries:
        seq += 1
        record = entry.seal(seq, prev_hash)
        prev_hash = record.hash
        records.append(record)
    return records


class _GroupCommitLog(_ChainedLog):
    """A log whose ``append_async`` hands records to one writer thread that commits whatever is
    queued in one transaction (group commit); subclasses write a batch in ``_commit_many``.

    Subclasses call ``_start_queue(label)`` in their constructor and ``_stop_writer()`` when they
    close.
    """

    _label: str
    _lock: threading.Lock
    _queue: queue.SimpleQueue[_Pending | _Job | None]
    _writer: threading.Thread | None
    _closed: bool

    def _start_queue(self, label: str) -> None:
        self._label = label
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._writer = None
        self._closed = False

    def _commit(self, entry: _Entry) -> AuditRecord:
        [record] = self._commit_many([entry])
        return record

    def _commit_many(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        raise NotImplementedError

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
        """Append like ``append`` without blocking the event loop: the writer thread commits it.

        Records appended by concurrent callers are committed together in one transaction (group
        commit). Once handed over, the record is written even when the awaiting task is cancelled.

        Returns:
            A future of the event loop that settles once the transaction holding the record has
            committed: the stored record, or the exception that kept it from being stored.

        Raises:
            ProtocolUsageError: When the log is closed.
        """
        if self._closed:
            raise ProtocolUsageError(f"the audit log {self._label} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AuditRecord] = loop.create_future()
        entry = _entry(actor, action, target, capability, request_id, code, detail, digest)
        self._hand_to_writer(_Pending(entry, loop, future))
        return future

    def _hand_to_writer(self, item: _Pending | _Job) -> None:
        """Queue a record (or a job) for the writer thread, starting it on first use."""
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write, name=f"audit-writer {self._label}", daemon=True
                    )
                    self._writer.start()
        self._queue.put(item)

    def _write(self) -> None:
        """The writer thread: commit whatever is queued, a batch per transaction, until closed."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            if isinstance(first, _Job):
                first.run()
                continue
            batch = [first]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    pending = self._queue.get_nowait()
                except queue.Empty:
                    break
                if pending is None:
                    stop = True
                    break
                if isinstance(pending, _Job):
                    pending.run()
                    continue
                batch.append(pending)
            outcomes: list[AuditRecord] | BaseException
            try:
                outcomes = self._commit_many([pending.entry for pending in batch])
            except Exception as exc:
                logger.error(
                    "cannot write %d audit records to %s: %s", len(batch), self._label, exc
                )
                outcomes = exc
            _report(batch, outcomes)
            if stop:
                return

    def _stop_writer(self) -> None:
        """Refuse new records, then let the writer commit the ones already queued and end."""
        self._closed = True
        writer = self._writer
        if writer is not None:
            self._queue.put(None)
            writer.join()


@dataclass(frozen=True, slots=True)
class _Job:
    """Work for the writer thread other than records (a WAL checkpoint); errors are logged."""

    run: Callable[[], None]


def _report(
    batch: list[_Pending],
    outcomes: list[AuditRecord] | BaseException,
    here: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Settle a batch's futures, each on its own event loop: at once for the loop ``here`` (the
    one running this code), through ``call_soon_threadsafe`` for any other."""
    by_loop: dict[
        asyncio.AbstractEventLoop,
        list[tuple[asyncio.Future[AuditRecord], AuditRecord | BaseException]],
    ] = {}
    for index, pending in enumerate(batch):
        outcome = outcomes if isinstance(outcomes, BaseException) else outcomes[index]
        by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, settled in by_loop.items():
        if loop is here:
            _resolve(settled)
            continue
        # A closed loop has nobody waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, settled)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds the lock (try again later)."""
    return getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES or "locked" in str(exc)


_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


class SqliteAuditLog(_GroupCommitLog):
    """An audit log in a SQLite file (WAL), shared safely by threads and processes.

    Args:
        path: The database file; its folder is created when missing.
        synchronous: ``"normal"`` (the default: a committed record survives a crash of the
            process, the last ones may be lost to an operating-system crash or power loss) or
            ``"full"`` (an fsync per commit: committed records survive those too).

    Raises:
        ProtocolUsageError: When the file holds an audit log of another schema version, or
            ``synchronous`` is neither ``"normal"`` nor ``"full"``.
    """

    _PAGE = 1000

    def __init__(self, path: str | Path, *, synchronous: Synchronous = "normal") -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ProtocolUsageError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Private to its owner: SQLite makes its -wal and -shm files with the database's mode.
        os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        self._synchronous: Synchronous = synchronous
        self._start_queue(str(self._path))
        # Autocommit mode: every transaction below is explicit.
        self._db = sqlite3.connect(
            self._path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._loop_db: sqlite3.Connection | None = None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[synchronous]}")
            self._migrate()
            if synchronous == "normal":
                # The event loop's connection: never waits for the write lock (busy timeout 0)
                # and never checkpoints (the writer thread does, every _CHECKPOINT_EVERY commits).
                self._loop_db = sqlite3.connect(
                    self._path, timeout=0, isolation_level=None, check_same_thread=False
                )
                self._loop_db.execute("PRAGMA synchronous=NORMAL")
                self._loop_db.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            self._db.close()
            if self._loop_db is not None:
                self._loop_db.close()
            raise
        self._loop_lock = threading.Lock()
        self._batch: list[_Pending] = []
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
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so the previous hash read inside the
        # transaction is still the last one when the new records are written, across processes.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._transaction() as db:
            for statement in _SCHEMA:
                db.execute(statement)
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise ProtocolUsageError(
                    f"audit log {self._path} has schema version {row[0]}; "
                    f"this build reads version {SCHEMA_VERSION}"
                )

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
        if self._loop_db is None:
            return super().append_async(
                actor=actor,
                action=action,
                target=target,
                capability=capability,
                request_id=request_id,
                code=code,
                detail=detail,
                digest=digest,
            )
        if self._closed:
            raise ProtocolUsageError(f"the audit log {self._label} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AuditRecord] = loop.create_future()
        entry = _entry(actor, action, target, capability, request_id, code, detail, digest)
        with self._loop_lock:
            self._batch.append(_Pending(entry, loop, future))
            first = len(self._batch) == 1
        if first:
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        """Commit the records appended since the last flush, on this thread when the write lock
        is free at once, else through the writer thread."""
        with self._loop_lock:
            batch, self._batch = self._batch, []
            if not batch:
                return
            outcomes: list[AuditRecord] | BaseException
            try:
                outcomes = self._commit_on_loop([pending.entry for pending in batch])
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    logger.error(
                        "cannot write %d audit records to %s: %s", len(batch), self._label, exc
                    )
                    outcomes = exc
                else:
                    outcomes = []
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
        db.execute("BEGIN IMMEDIATE")
        try:
            records = _chain(entries, db.execute(_SELECT_LAST).fetchone())
            db.executemany(
                _INSERT, [tuple(getattr(record, name) for name in _COLUMNS) for record in records]
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._loop_commits += 1
        if self._loop_commits % _CHECKPOINT_EVERY == 0:
            self._hand_to_writer(_Job(self._checkpoint))
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
        with self._transaction() as db:
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
            with self._lock:
                rows = self._db.execute(
                    _SELECT_PAGE,
                    (after, after, self._PAGE),
                ).fetchall()
            for row in rows:
                yield AuditRecord(*row)
            if len(rows) < self._PAGE:
                return
            after = rows[-1][0]

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with self._lock:
            row = self._db.execute(_SELECT_LAST).fetchone()
        return str(row[1]) if row else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        with self._lock:
            row = self._db.execute(_SELECT_LAST_RECORD).fetchone()
        return AuditRecord(*row) if row else None

    def remove_through(self, seq: int) -> int:
        """Delete the records up to ``seq`` (kept elsewhere: ``protocol._audit_archive``); the
        last record always stays, so the chain goes on from it. Returns how many were deleted.

        The append-only trigger is lifted for this one transaction, under the write lock.
        """
        with self._transaction() as db:
            last = db.execute(_SELECT_LAST).fetchone()
            if last is None:
                return 0
            through = min(seq, int(last[0]) - 1)
            db.execute("DROP TRIGGER audit_no_delete")
            removed = db.execute("DELETE FROM audit WHERE seq <= ?", (through,)).rowcount
            db.execute(_SCHEMA[3])
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


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """The result of ``verify_chain``.

    Attributes:
        ok: Whether the whole chain is intact.
        count: How many records verified before the first broken one (all of them when ``ok``).
        first_broken_seq: The ``seq`` of the first broken record (for a truncated tail, the first
            missing one), or ``None`` when ``ok`` (or when no record is to blame: ``heads_line``).
        reason: Why it is broken, one line; "" when ``ok``.
        sealed: How many signed heads verified (``verify_sealed`` in ``protocol._audit_seal``;
            always 0 from ``verify_chain``).
        heads_line: The line of the signed-heads file that does not verify, when that is what
            broke (``verify_sealed``); ``None`` otherwise.
    """

    ok: bool
    count: int
    first_broken_seq: int | None = None
    reason: str = ""
    sealed: int = 0
    heads_line: int | None = None


def verify_chain(
    records: Iterable[AuditRecord], *, expected_head: str | None = None
) -> ChainVerdict:
    """Recompute the hash chain and name the first broken record.

    Args:
        records: The records in ``seq`` order, e.g. ``log.records()``.
        expected_head: A head hash kept elsewhere; when given, a chain that does not end there was
            cut short.

    Returns:
        The verdict: edited records fail their own hash, deleted or reordered ones break the
        ``seq`` sequence or the ``prev_hash`` link.
    """
    prev_seq, prev_hash, count = 0, GENESIS, 0
    for record in records:
        reason = ""
        if record.hash != record.expected_hash():
            reason = "its hash does not match its contents: the record was edited"
        elif record.seq != prev_seq + 1:
            reason = f"seq {record.seq} follows seq {prev_seq}: records are missing or out of order"
        elif record.prev_hash != prev_hash:
            reason = "its prev_hash is not the previous record's hash: a record before it changed"
        if reason:
            logger.warning("audit chain broken at seq %s: %s", record.seq, reason)
            return ChainVerdict(ok=False, count=count, first_broken_seq=record.seq, reason=reason)
        prev_seq, prev_hash, count = record.seq, record.hash, count + 1
    if expected_head is not None and prev_hash != expected_head:
        reason = f"the chain ends at seq {prev_seq}, before the expected head: records were removed"
        return ChainVerdict(ok=False, count=count, first_broken_seq=prev_seq + 1, reason=reason)
    return ChainVerdict(ok=True, count=count)
