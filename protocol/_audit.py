"""The audit log: append-only, hash-chained, free of payloads and secrets.

Each record's ``hash`` is ``sha256(prev_hash + canonical JSON of the record without its hash)``,
where canonical JSON is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
and the first record's ``prev_hash`` is ``GENESIS``. Editing, deleting or reordering a record
therefore breaks the chain at that record, and ``verify_chain`` names the first one broken.
Removing records from the end shows only against a head kept elsewhere (``expected_head``).

A record holds the sha256 ``digest`` of a payload, never the payload, and a ``detail`` that is a
redacted one-line summary: whitespace collapsed, ``key=value`` secrets masked, length capped.

``SqliteAuditLog`` is safe to share between threads and processes: each append reads the previous
hash and writes the new record inside one ``BEGIN IMMEDIATE`` transaction. Its methods block; async
code calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol

from protocol._errors import ProtocolUsageError

__all__ = [
    "GENESIS",
    "AuditLog",
    "AuditRecord",
    "ChainVerdict",
    "InMemoryAuditLog",
    "SqliteAuditLog",
    "digest",
    "redact",
    "verify_chain",
]

logger = logging.getLogger(__name__)

GENESIS: Final = "0" * 64
"""The ``prev_hash`` of the first record."""

SCHEMA_VERSION: Final = 1

# A secret-looking key and its value ("password=x", "token: x", "Authorization: Bearer x").
_SECRET = re.compile(
    r"(?i)\b(password|passwd|secret|token|api[_-]?key|authorization|bearer|cookie)\b"
    r"(\s*[:=]\s*|\s+)(?:(?:bearer|basic)\s+)?\S+"
)
_DETAIL_LIMIT: Final = 240
_FIELD_LIMIT: Final = 128


def digest(data: bytes) -> str:
    """The hex sha256 of ``data``: what the audit log keeps instead of a payload."""
    return hashlib.sha256(data).hexdigest()


def redact(text: str, limit: int = _DETAIL_LIMIT) -> str:
    """``text`` as one line: whitespace collapsed, ``key=value`` secrets masked, at most ``limit``.

    Args:
        text: Free text, e.g. an error message.
        limit: The maximum length of the result.

    Returns:
        The redacted line; ``password=hunter2`` becomes ``password=***``.
    """
    line = _SECRET.sub(lambda match: f"{match.group(1)}{match.group(2)}***", " ".join(text.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _canonical(fields: dict[str, object]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
        fields = dataclasses.asdict(self)
        del fields["hash"]
        return hashlib.sha256((self.prev_hash + _canonical(fields)).encode("utf-8")).hexdigest()


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
        unsealed = AuditRecord(
            seq=seq, ts=ts, **dataclasses.asdict(self), prev_hash=prev_hash, hash=""
        )
        return dataclasses.replace(unsealed, hash=unsealed.expected_hash())


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
        entry = _Entry(
            actor=redact(actor, _FIELD_LIMIT),
            action=redact(action, _FIELD_LIMIT),
            target=redact(target, _FIELD_LIMIT),
            capability=redact(capability, _FIELD_LIMIT),
            request_id=redact(request_id, 400),
            code=redact(code, _FIELD_LIMIT),
            detail=redact(detail),
            digest=redact(digest, _FIELD_LIMIT),
        )
        return self._commit(entry)

    def _commit(self, entry: _Entry) -> AuditRecord:
        raise NotImplementedError


class InMemoryAuditLog(_ChainedLog):
    """An audit log in a list: for tests and for runs that keep no state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[AuditRecord] = []

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


_COLUMNS: Final = tuple(field.name for field in dataclasses.fields(AuditRecord))
_INSERT: Final = (
    f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_SELECT_PAGE: Final = (
    f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?"
)
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


class SqliteAuditLog(_ChainedLog):
    """An audit log in a SQLite file (WAL), shared safely by threads and processes.

    Args:
        path: The database file; its folder is created when missing.

    Raises:
        ProtocolUsageError: When the file holds an audit log of another schema version.
    """

    _PAGE = 1000

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Autocommit mode: every transaction below is explicit.
        self._db = sqlite3.connect(
            self._path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so the previous hash read inside the
        # transaction is still the last one when the new record is written, across processes too.
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

    def _commit(self, entry: _Entry) -> AuditRecord:
        with self._transaction() as db:
            last = db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS)
            record = entry.seal(seq, prev_hash)
            db.execute(
                _INSERT,
                dataclasses.astuple(record),
            )
        return record

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
            row = self._db.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return str(row[0]) if row else GENESIS

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

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
            missing one), or ``None`` when ``ok``.
        reason: Why it is broken, one line; "" when ``ok``.
    """

    ok: bool
    count: int
    first_broken_seq: int | None = None
    reason: str = ""


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
