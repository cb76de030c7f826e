"""``SqliteStateStore``: the embedded ``StateStore``, one SQLite file in WAL mode.

Durability: the database runs with ``journal_mode=WAL`` and ``synchronous=NORMAL``. A commit that
returned survives a crash of the process (the WAL is in the OS's hands); an OS crash or power loss
may lose the last commits, never corrupt the database. The engine starts a side effect only after
the commit holding its intent returned, and acknowledges a plan's end only after its final commit,
so what a power loss can take is work that was never acted on or never acknowledged.

All SQLite work happens on one thread the store owns (a single-worker executor), so the event loop
never blocks on disk and commits are applied in call order; the connection is opened on first use
(or by ``start``) and closed by ``aclose``.

Schema (version 1)::

    schema_version(version)                         one row: the schema's version
    plans(id, plan_id, revision, plan_type, plan_json, status, created, updated)
                                                    one row per (plan id, revision); plan_json is
                                                    written once, status/updated follow the journal
    events(plan, seq, kind, step_id, attempt, status, output, data)
                                                    the append-only journal: one row per record,
                                                    clustered by plan (WITHOUT ROWID)

Migrations are an ordered list of functions; ``schema_version`` says how many have run, and
opening a store whose version is newer than the list is a ``StoreSchemaError``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from pathlib import Path
from typing import Any, Final, TypeVar, assert_never

from planning._errors import StoreError, StoreSchemaError
from planning._plan import FailureClass, Plan, PlanStatus, StepStatus
from planning._store import (
    CompensationRecord,
    CompensationStatus,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    PlanState,
    PlanStatusRecord,
    Record,
    StepIntent,
    StepResult,
    StoreStats,
    fold,
)

__all__ = ["MIGRATIONS", "SqliteStateStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

Migration = Callable[[sqlite3.Connection], None]

_FINAL: Final = tuple(status.value for status in PlanStatus if status.is_final)

# Record kinds as stored in events.kind: never renumber, only add.
_PLAN_STATUS: Final = 1
_STEP_INTENT: Final = 2
_STEP_RESULT: Final = 3
_GATE: Final = 4
_COMPENSATION: Final = 5
_CONTROL: Final = 6

_Row = tuple[int, str | None, int | None, str | None, str | None, str | None]


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE plans (
            id INTEGER PRIMARY KEY,
            plan_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            plan_type TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            status TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            UNIQUE (plan_id, revision)
        )"""
    )
    conn.execute("CREATE INDEX plans_by_status ON plans (status, updated)")
    # Clustered by plan: one b-tree to append to per commit (no secondary index to maintain),
    # and a plan's journal is one contiguous range to read on load.
    conn.execute(
        """CREATE TABLE events (
            plan INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            kind INTEGER NOT NULL,
            step_id TEXT,
            attempt INTEGER,
            status TEXT,
            output TEXT,
            data TEXT,
            PRIMARY KEY (plan, seq)
        ) WITHOUT ROWID"""
    )


MIGRATIONS: Final[list[Migration]] = [_migrate_v1]
"""The schema migrations, oldest first; migration ``i`` (from 0) brings the schema to ``i + 1``."""


class SqliteStateStore:
    """A ``StateStore`` in one SQLite file (WAL, ``synchronous=NORMAL``).

    Use it with ``async with SqliteStateStore(path) as store:`` or call ``start``/``aclose``; the
    methods also open the database on first use.

    Args:
        path: The database file; its directory is created when missing.
        busy_timeout_s: How long a write waits for another connection's lock.
    """

    def __init__(self, path: str | PathLike[str], *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._rowids: dict[tuple[str, int], int] = {}
        self._seq = -1  # the last journal sequence number; read from the file on first commit
        self._closed = False

    async def __aenter__(self) -> SqliteStateStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the database and run pending migrations.

        Raises:
            StoreSchemaError: When the schema is newer than this code knows, or a migration fails.
            StoreError: When the file cannot be opened.
        """
        await self._call(self._connection)

    async def aclose(self) -> None:
        """Close the connection and stop the store's thread."""
        if self._closed:
            return
        self._closed = True
        executor = self._executor
        if executor is None:
            return
        await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
        executor.shutdown(wait=False)
        self._executor = None

    async def schema_version(self) -> int:
        """The schema version of the open database."""
        return await self._call(lambda: _read_version(self._connection()))

    async def save_plan(self, plan: Plan) -> bool:
        """See ``StateStore.save_plan``."""
        plan_json = plan.model_dump_json()
        plan_type = f"{type(plan).__module__}.{type(plan).__qualname__}"
        return await self._call(self._save_plan, plan.id, plan.revision, plan_type, plan_json)

    async def commit(self, records: Sequence[Record]) -> None:
        """See ``StateStore.commit``: one transaction for all of ``records``."""
        if records:
            await self._call(self._commit, list(records))

    async def load(self, plan_id: str) -> PlanState | None:
        """See ``StateStore.load``."""
        return await self._call(self._load, plan_id)

    async def unfinished(self) -> list[str]:
        """See ``StateStore.unfinished``."""
        return await self._call(self._unfinished)

    async def prune(self, *, before: float | None = None, keep_last: int | None = None) -> int:
        """See ``StateStore.prune``."""
        return await self._call(self._prune, before, keep_last)

    async def stats(self) -> StoreStats:
        """See ``StateStore.stats``; ``bytes`` is the pages in use (after a WAL checkpoint)."""
        return await self._call(self._stats)

    # --- on the store's thread ---------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("the state store is closed", location=str(self.path))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="stratagem-store")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {self.path}: {exc}", location=str(self.path)) from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        location = str(self.path)
        known = len(MIGRATIONS)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = _read_version(conn)
            if found > known:
                raise StoreSchemaError(
                    f"the state store {location} has schema version {found}, newer than this "
                    f"code knows ({known}); upgrade Stratagem or use another state directory",
                    location=location,
                    found=found,
                    known=known,
                )
            for version in range(found, known):
                MIGRATIONS[version](conn)
                logger.info("state store %s: migrated to schema version %d", location, version + 1)
            if found < known:
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (known,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.rollback()
            raise StoreSchemaError(
                f"cannot migrate the state store {location}: {exc}",
                location=location,
                found=-1,
                known=known,
            ) from exc
        except BaseException:
            conn.rollback()
            raise

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _error(self, action: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"cannot {action} in {self.path}: {exc}", location=str(self.path))

    def _save_plan(self, plan_id: str, revision: int, plan_type: str, plan_json: str) -> bool:
        conn = self._connection()
        now = time.time()
        try:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO plans "
                "(plan_id, revision, plan_type, plan_json, status, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (plan_id, revision, plan_type, plan_json, PlanStatus.PENDING.value, now, now),
            )
        except sqlite3.Error as exc:
            raise self._error(f"save plan {plan_id!r}", exc) from exc
        return cursor.rowcount == 1

    def _rowid(self, conn: sqlite3.Connection, plan_id: str, revision: int) -> int:
        key = (plan_id, revision)
        rowid = self._rowids.get(key)
        if rowid is None:
            row = conn.execute(
                "SELECT id FROM plans WHERE plan_id = ? AND revision = ?", key
            ).fetchone()
            if row is None:
                raise StoreError(
                    f"plan {plan_id!r} revision {revision} was never saved",
                    location=str(self.path),
                )
            rowid = self._rowids[key] = int(row[0])
        return rowid

    def _commit(self, records: list[Record]) -> None:
        conn = self._connection()
        try:
            if self._seq < 0:
                row = conn.execute("SELECT max(seq) FROM events").fetchone()
                self._seq = 0 if row is None or row[0] is None else int(row[0])
            seq = self._seq
            rows = []
            statuses: dict[int, tuple[str, float]] = {}
            for record in records:
                rowid = self._rowid(conn, record.plan_id, record.revision)
                seq += 1
                rows.append((rowid, seq, *_encode(record)))
                if isinstance(record, PlanStatusRecord):
                    statuses[rowid] = (record.status.value, record.at)
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO events (plan, seq, kind, step_id, attempt, status, output, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                if statuses:
                    conn.executemany(
                        "UPDATE plans SET status = ?, updated = ? WHERE id = ?",
                        [(status, at, rowid) for rowid, (status, at) in statuses.items()],
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
            self._seq = seq
        except sqlite3.Error as exc:
            raise self._error(f"commit {len(records)} record(s)", exc) from exc

    def _load(self, plan_id: str) -> PlanState | None:
        conn = self._connection()
        try:
            row = conn.execute(
                "SELECT id, revision, plan_json FROM plans WHERE plan_id = ? "
                "ORDER BY revision DESC LIMIT 1",
                (plan_id,),
            ).fetchone()
            if row is None:
                return None
            rowid, revision, plan_json = int(row[0]), int(row[1]), str(row[2])
            rows = conn.execute(
                "SELECT kind, step_id, attempt, status, output, data FROM events "
                "WHERE plan = ? ORDER BY seq",
                (rowid,),
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._error(f"load plan {plan_id!r}", exc) from exc
        return fold(plan_id, revision, plan_json, (_decode(plan_id, revision, r) for r in rows))

    def _unfinished(self) -> list[str]:
        conn = self._connection()
        marks = ", ".join("?" * len(_FINAL))
        try:
            rows = conn.execute(
                f"SELECT plan_id FROM plans WHERE status NOT IN ({marks}) ORDER BY created, id",
                _FINAL,
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._error("list unfinished plans", exc) from exc
        return list(dict.fromkeys(str(r[0]) for r in rows))

    def _prune(self, before: float | None, keep_last: int | None) -> int:
        conn = self._connection()
        marks = ", ".join("?" * len(_FINAL))
        try:
            rows = conn.execute(
                f"SELECT id, updated FROM plans WHERE status IN ({marks}) ORDER BY updated DESC",
                _FINAL,
            ).fetchall()
            candidates = rows[keep_last:] if keep_last else rows
            doomed = [(int(r[0]),) for r in candidates if before is None or float(r[1]) < before]
            if not doomed:
                return 0
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("DELETE FROM events WHERE plan = ?", doomed)
                conn.executemany("DELETE FROM plans WHERE id = ?", doomed)
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        except sqlite3.Error as exc:
            raise self._error("prune plans", exc) from exc
        self._rowids.clear()
        logger.info("state store %s: pruned %d finished plan(s)", self.path, len(doomed))
        return len(doomed)

    def _stats(self) -> StoreStats:
        conn = self._connection()
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            plans = int(conn.execute("SELECT count(*) FROM plans").fetchone()[0])
            records = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
            pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
            free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        except sqlite3.Error as exc:
            raise self._error("measure the store", exc) from exc
        return StoreStats(plans=plans, records=records, bytes=(pages - free) * page_size)


def _read_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def _encode(record: Record) -> _Row:
    """A record as (kind, step_id, attempt, status, output, data) columns."""
    match record:
        case PlanStatusRecord():
            return (
                _PLAN_STATUS,
                None,
                None,
                record.status.value,
                None,
                _json([record.message, record.at]),
            )
        case StepIntent():
            return _STEP_INTENT, record.step_id, record.attempt, None, None, None
        case StepResult():
            data = (
                None
                if record.failure_class is None
                else _json([record.failure_class.value, record.message])
            )
            return (
                _STEP_RESULT,
                record.step_id,
                record.attempt,
                record.status.value,
                record.output_json,
                data,
            )
        case GateRecord():
            data = _json(
                [record.kind.value, record.prompt, record.approver, record.rationale, record.at]
            )
            return _GATE, record.gate_id, None, record.decision.value, record.output_json, data
        case CompensationRecord():
            return (
                _COMPENSATION,
                record.step_id,
                record.attempt,
                record.status.value,
                None,
                record.message or None,
            )
        case ControlRecord():
            return _CONTROL, None, None, record.action, None, _json([record.at])
        case _:
            assert_never(record)


def _decode(plan_id: str, revision: int, row: Sequence[Any]) -> Record:
    kind, step_id, attempt, status, output, data = row
    match kind:
        case 1:
            message, at = json.loads(data)
            return PlanStatusRecord(plan_id, revision, PlanStatus(status), message, at)
        case 2:
            return StepIntent(plan_id, revision, step_id, attempt)
        case 3:
            failure_class, message = (None, "") if data is None else json.loads(data)
            return StepResult(
                plan_id,
                revision,
                step_id,
                attempt,
                StepStatus(status),
                output,
                None if failure_class is None else FailureClass(failure_class),
                message,
            )
        case 4:
            gate_kind, prompt, approver, rationale, at = json.loads(data)
            return GateRecord(
                plan_id,
                revision,
                step_id,
                GateDecision(status),
                GateKind(gate_kind),
                prompt,
                approver,
                rationale,
                output,
                at,
            )
        case 5:
            return CompensationRecord(
                plan_id, revision, step_id, CompensationStatus(status), attempt, data or ""
            )
        case 6:
            (at,) = json.loads(data)
            return ControlRecord(plan_id, revision, "cancel", at)
        case _:
            raise StoreError(f"unknown record kind {kind!r} in the journal of plan {plan_id!r}")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
