"""``SqliteStateStore``: the embedded ``StateStore``, one SQLite file in WAL mode.

Durability: the database runs with ``journal_mode=WAL`` and ``synchronous=NORMAL``. A commit that
returned survives a crash of the process (the WAL is in the OS's hands); an OS crash or power loss
may lose the last commits, never corrupt the database. The engine starts a side effect only after
the commit holding its intent returned, and acknowledges a plan's end only after its final commit,
so what a power loss can take is work that was never acted on or never acknowledged.

Calls run one after another, in call order, on the caller's thread by default: the engine batches
each scheduler tick into one short transaction, which costs less than the round trip to another
thread (measured: a side-effecting step 2x cheaper). With ``threaded=True`` they run instead on the
store's ``StoreWorker`` (``protocol._storage``: one thread that hands each result back to the
caller's loop). The connection is opened on first use (or by ``start``) and closed by ``aclose``.

Schema (version 4)::

    schema_version(version)                         one row: the schema's version
    plans(id, plan_id, revision, plan_type, status, created, updated)
                                                    one row per (plan id, revision); status and
                                                    updated follow the journal
    plan_bodies(id, plan_json)                      the revision's plan, written once (apart from
                                                    plans so a status change rewrites a small row)
    events(plan, seq, kind, step_id, attempt, status, output, data)
                                                    the append-only journal: one row per record,
                                                    clustered by plan (WITHOUT ROWID)
    revisions(plan_id, revision, parent, rationale, author, diff, carried, at)
                                                    the history of revisions made by a replan
                                                    (a first revision has no row: its plans row
                                                    stands for it)
    breakers(tool, failures, opened_at)             the engine's circuit breakers
    plan_index(id, plan_id, revision, status, goal, trace_id, message, created, updated)
                                                    the history: one row per plan, numbered in
                                                    creation order (``_history``)

Migrations are an ordered list of functions (``MIGRATIONS``, component ``plans``); the shared
runner (``protocol._storage``) runs them, ``schema_version`` says how many have run, and opening a
store whose version is newer than the list is a ``StoreSchemaError``. The file, the transactions
and the translation of ``sqlite3`` errors into the ``StoreError`` family are the shared SQLite
seam's (``protocol._storage._sqlite``).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Final, TypeVar

from opentelemetry.metrics import MeterProvider

from stratagem.planning._errors import STORE_ERRORS, StoreError
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import Plan, PlanStatus
from stratagem.planning._revisions import RevisionDiff, RevisionRecord
from stratagem.planning._store._history import (
    HistoryQuery,
    PlanSummary,
    trace_id_of,
    where_clause,
)
from stratagem.planning._store._rows import (
    IndexRow,
    compact_json,
    decode_record,
    encode_record,
    index_row,
)
from stratagem.planning._store._state import (
    BreakerState,
    PlanState,
    PlanStatusRecord,
    Record,
    StoreStats,
    fold,
)
from stratagem.protocol._storage import StorageError, StoreWorker
from stratagem.protocol._storage._sqlite import (
    connect,
    migrate_file,
    read_version,
    storage_error,
    transaction,
)

__all__ = ["MIGRATIONS", "SqliteStateStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

Migration = Callable[[sqlite3.Connection], None]

_FINAL: Final = tuple(status.value for status in PlanStatus if status.is_final)


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


def _migrate_v2(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE revisions (
            plan_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            parent INTEGER,
            rationale TEXT NOT NULL,
            author TEXT NOT NULL,
            diff TEXT NOT NULL,
            carried TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (plan_id, revision)
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TABLE breakers (
            tool TEXT PRIMARY KEY,
            failures INTEGER NOT NULL,
            opened_at REAL
        ) WITHOUT ROWID"""
    )


def _migrate_v3(conn: sqlite3.Connection) -> None:
    # A plan's JSON moves to a table of its own: a status change then rewrites a small row, not
    # the plan (3.3 MB for a 10,000-step plan, rewritten at every pause, gate or resume).
    conn.execute(
        """CREATE TABLE plan_bodies (
            id INTEGER PRIMARY KEY,
            plan_json TEXT NOT NULL
        )"""
    )
    conn.execute("INSERT INTO plan_bodies (id, plan_json) SELECT id, plan_json FROM plans")
    conn.execute(
        """CREATE TABLE plans_v3 (
            id INTEGER PRIMARY KEY,
            plan_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            plan_type TEXT NOT NULL,
            status TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            UNIQUE (plan_id, revision)
        )"""
    )
    conn.execute(
        "INSERT INTO plans_v3 (id, plan_id, revision, plan_type, status, created, updated) "
        "SELECT id, plan_id, revision, plan_type, status, created, updated FROM plans"
    )
    conn.execute("DROP TABLE plans")
    conn.execute("ALTER TABLE plans_v3 RENAME TO plans")
    conn.execute("CREATE INDEX plans_by_status ON plans (status, updated)")


def _migrate_v4(conn: sqlite3.Connection) -> None:
    # The history: one row per plan (see ``_history``), numbered in creation order, filled for
    # the plans stored before it from their newest revision and their status records.
    conn.execute(
        """CREATE TABLE plan_index (
            id INTEGER PRIMARY KEY,
            plan_id TEXT NOT NULL UNIQUE,
            revision INTEGER NOT NULL,
            status TEXT NOT NULL,
            goal TEXT NOT NULL,
            trace_id TEXT NOT NULL,
            message TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX plan_index_by_trace ON plan_index (trace_id)")
    plans = conn.execute(
        "SELECT p.plan_id, p.revision, p.updated, b.plan_json, "
        "(SELECT min(created) FROM plans WHERE plan_id = p.plan_id) AS first "
        "FROM plans AS p JOIN plan_bodies AS b ON b.id = p.id WHERE p.revision = "
        "(SELECT max(revision) FROM plans WHERE plan_id = p.plan_id) ORDER BY first, p.id"
    ).fetchall()
    for plan_id, revision, updated, plan_json, created in plans:
        statuses = conn.execute(
            "SELECT p.revision, e.kind, e.step_id, e.attempt, e.status, e.output, e.data "
            "FROM events AS e JOIN plans AS p ON p.id = e.plan "
            "WHERE p.plan_id = ? AND e.kind = 1 ORDER BY e.seq",
            (plan_id,),
        ).fetchall()
        row = index_row(
            str(plan_id),
            int(revision),
            str(plan_json),
            float(created),
            float(updated),
            (decode_record(str(plan_id), int(r[0]), r[1:]) for r in statuses),
        )
        conn.execute(_INDEX_INSERT, _index_values(row))


_INDEX_INSERT: Final = (
    "INSERT INTO plan_index (plan_id, revision, status, goal, trace_id, message, created, "
    "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _index_values(row: IndexRow) -> tuple[object, ...]:
    return (
        row.plan_id,
        row.revision,
        row.status,
        row.goal,
        row.trace_id,
        row.message,
        row.created,
        row.updated,
    )


MIGRATIONS: Final[list[Migration]] = [_migrate_v1, _migrate_v2, _migrate_v3, _migrate_v4]
"""The schema migrations, oldest first; migration ``i`` (from 0) brings the schema to ``i + 1``."""


class SqliteStateStore:
    """A ``StateStore`` in one SQLite file (WAL, ``synchronous=NORMAL``).

    Use it with ``async with SqliteStateStore(path) as store:`` or call ``start``/``aclose``; the
    methods also open the database on first use.

    By default every call runs on the caller's thread, one after another: the engine batches a
    scheduler tick's records into one transaction of a few rows, which WAL with
    ``synchronous=NORMAL`` commits in tens of microseconds, less than handing it to a thread and
    back (which made a side-effecting step cost 2x more). This suits the one process that owns the
    file (an agent and its own store). ``threaded=True`` runs every call on the store's own thread
    instead, for files shared with other writers or plans so large that saving them takes long.

    Args:
        path: The database file; its directory is created when missing.
        busy_timeout_s: How long a write waits for another connection's lock.
        threaded: Run calls on the store's own thread rather than the caller's.
        meter_provider: Where the commit latency histogram goes
            (``stratagem.store.commit.duration``); the global provider by default.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        busy_timeout_s: float = 5.0,
        threaded: bool = False,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.path = Path(path)
        self._metrics = PlanningMetrics(meter_provider)
        self._busy_timeout_s = busy_timeout_s
        self._worker = StoreWorker("stratagem-store") if threaded else None
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
        worker = self._worker
        if worker is None or worker.thread is None:
            self._close_connection()
            return
        try:
            await worker.call(self._close_connection)
        finally:
            worker.stop(wait=False)  # the thread ends after the jobs before it

    async def schema_version(self) -> int:
        """The schema version of the open database."""
        return await self._call(lambda: read_version(self._connection()))

    async def save_plan(self, plan: Plan) -> bool:
        """See ``StateStore.save_plan``."""
        plan_json = plan.model_dump_json()
        plan_type = f"{type(plan).__module__}.{type(plan).__qualname__}"
        return await self._call(
            self._save_plan, plan.id, plan.revision, plan_type, plan_json, plan.goal
        )

    async def commit(self, records: Sequence[Record]) -> None:
        """See ``StateStore.commit``: one transaction for all of ``records``."""
        if records:
            started = time.perf_counter()
            await self._call(self._commit, list(records))
            self._metrics.commit_recorded("sqlite", time.perf_counter() - started)

    async def load(self, plan_id: str, revision: int | None = None) -> PlanState | None:
        """See ``StateStore.load``."""
        return await self._call(self._load, plan_id, revision)

    async def journal(self, plan_id: str, revision: int | None = None) -> list[Record]:
        """See ``StateStore.journal``."""
        return await self._call(self._journal, plan_id, revision)

    async def save_revision(
        self, plan: Plan, record: RevisionRecord, records: Sequence[Record]
    ) -> None:
        """See ``StateStore.save_revision``: one transaction."""
        plan_json = plan.model_dump_json()
        plan_type = f"{type(plan).__module__}.{type(plan).__qualname__}"
        await self._call(self._save_revision, plan, plan_type, plan_json, record, list(records))

    async def revisions(self, plan_id: str) -> list[RevisionRecord]:
        """See ``StateStore.revisions``."""
        return await self._call(self._revisions, plan_id)

    async def breakers(self) -> list[BreakerState]:
        """See ``StateStore.breakers``."""
        return await self._call(self._breakers)

    async def save_breaker(self, state: BreakerState) -> None:
        """See ``StateStore.save_breaker``."""
        await self._call(self._save_breaker, state)

    async def unfinished(self) -> list[str]:
        """See ``StateStore.unfinished``."""
        return await self._call(self._unfinished)

    async def prune(self, *, before: float | None = None, keep_last: int | None = None) -> int:
        """See ``StateStore.prune``."""
        return await self._call(self._prune, before, keep_last)

    async def history(self, query: HistoryQuery) -> list[PlanSummary]:
        """See ``StateStore.history``."""
        return await self._call(self._history, query)

    async def stats(self) -> StoreStats:
        """See ``StateStore.stats``; ``bytes`` is the pages in use (after a WAL checkpoint)."""
        return await self._call(self._stats)

    # --- on the store's thread ---------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("the state store is closed", location=str(self.path))
        if self._worker is None:
            return fn(*args)
        return await self._worker.call(fn, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        conn = connect(self.path, timeout_s=self._busy_timeout_s, errors=STORE_ERRORS)
        try:
            migrate_file(
                conn,
                "plans",
                MIGRATIONS,
                location=str(self.path),
                what="state store",
                errors=STORE_ERRORS,
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _error(self, action: str, exc: sqlite3.Error) -> StorageError:
        return storage_error(action, str(self.path), exc, STORE_ERRORS)

    def _save_plan(
        self, plan_id: str, revision: int, plan_type: str, plan_json: str, goal: str
    ) -> bool:
        conn = self._connection()
        now = time.time()
        try:
            with transaction(conn):
                saved = _insert_plan(
                    conn,
                    plan_id,
                    revision,
                    plan_type,
                    plan_json,
                    PlanStatus.PENDING.value,
                    now,
                    goal,
                )
        except sqlite3.Error as exc:
            raise self._error(f"save plan {plan_id!r}", exc) from exc
        return saved

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

    def _save_revision(
        self,
        plan: Plan,
        plan_type: str,
        plan_json: str,
        record: RevisionRecord,
        records: list[Record],
    ) -> None:
        conn = self._connection()
        now = time.time()
        try:
            with transaction(conn):
                saved = _insert_plan(
                    conn,
                    plan.id,
                    plan.revision,
                    plan_type,
                    plan_json,
                    PlanStatus.PENDING.value,
                    now,
                    plan.goal,
                )
                if not saved:
                    raise StoreError(
                        f"plan {plan.id!r} revision {plan.revision} is already stored",
                        location=str(self.path),
                    )
                conn.execute(
                    "INSERT INTO revisions "
                    "(plan_id, revision, parent, rationale, author, diff, carried, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.plan_id,
                        record.revision,
                        record.parent,
                        record.rationale,
                        record.author,
                        compact_json(record.diff.to_json()),
                        compact_json(record.carried),
                        record.at,
                    ),
                )
                self._append(conn, records)
        except sqlite3.Error as exc:
            self._seq = -1  # re-read: _append may have advanced it
            raise self._error(f"save revision {plan.revision} of plan {plan.id!r}", exc) from exc
        except BaseException:
            self._seq = -1
            raise

    def _revisions(self, plan_id: str) -> list[RevisionRecord]:
        conn = self._connection()
        try:
            plans = conn.execute(
                "SELECT revision, created FROM plans WHERE plan_id = ? ORDER BY revision",
                (plan_id,),
            ).fetchall()
            rows = {
                int(r[0]): r
                for r in conn.execute(
                    "SELECT revision, parent, rationale, author, diff, carried, at "
                    "FROM revisions WHERE plan_id = ?",
                    (plan_id,),
                ).fetchall()
            }
        except sqlite3.Error as exc:
            raise self._error(f"read the revisions of plan {plan_id!r}", exc) from exc
        history = []
        for revision, created in plans:
            row = rows.get(int(revision))
            if row is None:
                history.append(RevisionRecord(plan_id, int(revision), None, at=float(created)))
                continue
            history.append(
                RevisionRecord(
                    plan_id,
                    int(revision),
                    None if row[1] is None else int(row[1]),
                    str(row[2]),
                    str(row[3]),
                    RevisionDiff.from_json(json.loads(row[4])),
                    list(json.loads(row[5])),
                    float(row[6]),
                )
            )
        return history

    def _breakers(self) -> list[BreakerState]:
        conn = self._connection()
        try:
            rows = conn.execute("SELECT tool, failures, opened_at FROM breakers").fetchall()
        except sqlite3.Error as exc:
            raise self._error("read the circuit breakers", exc) from exc
        return [
            BreakerState(str(r[0]), int(r[1]), None if r[2] is None else float(r[2])) for r in rows
        ]

    def _save_breaker(self, state: BreakerState) -> None:
        conn = self._connection()
        try:
            conn.execute(
                "INSERT OR REPLACE INTO breakers (tool, failures, opened_at) VALUES (?, ?, ?)",
                (state.tool, state.failures, state.opened_at),
            )
        except sqlite3.Error as exc:
            raise self._error(f"save the circuit breaker of tool {state.tool!r}", exc) from exc

    def _append(self, conn: sqlite3.Connection, records: list[Record]) -> None:
        """Insert ``records`` inside the caller's transaction."""
        if not records:
            return
        if self._seq < 0:
            row = conn.execute("SELECT max(seq) FROM events").fetchone()
            self._seq = 0 if row is None or row[0] is None else int(row[0])
        seq = self._seq
        rows = []
        statuses: dict[int, PlanStatusRecord] = {}
        traces: dict[int, str] = {}  # the batch's first trace of each plan
        plan_id: str | None = None  # the previous record's plan (None: no record yet)
        revision = rowid = 0
        for record in records:
            if record.plan_id != plan_id or record.revision != revision:
                # A batch is mostly one run's records: the plan's row is asked when it changes.
                plan_id, revision = record.plan_id, record.revision
                rowid = self._rowid(conn, plan_id, revision)
            seq += 1
            rows.append((rowid, seq, *encode_record(record)))
            if isinstance(record, PlanStatusRecord):
                statuses[rowid] = record
                if record.trace_context and rowid not in traces:
                    traces[rowid] = trace_id_of(record.trace_context)
        conn.executemany(
            "INSERT INTO events (plan, seq, kind, step_id, attempt, status, output, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        if statuses:
            conn.executemany(
                "UPDATE plans SET status = ?, updated = ? WHERE id = ?",
                [(r.status.value, r.at, rowid) for rowid, r in statuses.items()],
            )
            conn.executemany(
                "UPDATE plan_index SET status = ?, updated = ?, message = ?, trace_id = CASE "
                "WHEN trace_id = '' THEN ? ELSE trace_id END WHERE plan_id = ? AND revision = ?",
                [
                    (
                        r.status.value,
                        r.at,
                        r.message,
                        traces.get(rowid, ""),
                        r.plan_id,
                        r.revision,
                    )
                    for rowid, r in statuses.items()
                ],
            )
        self._seq = seq

    def _commit(self, records: list[Record]) -> None:
        conn = self._connection()
        try:
            with transaction(conn):
                self._append(conn, records)
        except sqlite3.Error as exc:
            raise self._error(f"commit {len(records)} record(s)", exc) from exc

    def _journal(self, plan_id: str, revision: int | None) -> list[Record]:
        conn = self._connection()
        try:
            if revision is None:
                row = conn.execute(
                    "SELECT id, revision FROM plans WHERE plan_id = ? "
                    "ORDER BY revision DESC LIMIT 1",
                    (plan_id,),
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT id, revision FROM plans WHERE plan_id = ? AND revision = ?",
                    (plan_id, revision),
                ).fetchone()
            if row is None:
                return []
            rows = conn.execute(
                "SELECT kind, step_id, attempt, status, output, data FROM events "
                "WHERE plan = ? ORDER BY seq",
                (int(row[0]),),
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._error(f"read the journal of plan {plan_id!r}", exc) from exc
        return [decode_record(plan_id, int(row[1]), r) for r in rows]

    def _load(self, plan_id: str, revision: int | None = None) -> PlanState | None:
        conn = self._connection()
        try:
            row = conn.execute(
                "SELECT p.id, p.revision, b.plan_json FROM plans AS p "
                "JOIN plan_bodies AS b ON b.id = p.id WHERE p.plan_id = ? "
                "AND (? IS NULL OR p.revision = ?) ORDER BY p.revision DESC LIMIT 1",
                (plan_id, revision, revision),
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
        return fold(
            plan_id, revision, plan_json, (decode_record(plan_id, revision, r) for r in rows)
        )

    def _unfinished(self) -> list[str]:
        conn = self._connection()
        marks = ", ".join("?" * len(_FINAL))
        try:
            rows = conn.execute(
                f"SELECT plan_id FROM plans AS p WHERE status NOT IN ({marks}) AND revision = "
                "(SELECT max(revision) FROM plans WHERE plan_id = p.plan_id) ORDER BY created, id",
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
                f"SELECT plan_id, updated FROM plans AS p WHERE status IN ({marks}) AND revision "
                "= (SELECT max(revision) FROM plans WHERE plan_id = p.plan_id) "
                "ORDER BY updated DESC",
                _FINAL,
            ).fetchall()
            candidates = rows[keep_last:] if keep_last else rows
            ids = [(str(r[0]),) for r in candidates if before is None or float(r[1]) < before]
            if not ids:
                return 0
            doomed = [
                (int(r[0]),)
                for (plan_id,) in ids
                for r in conn.execute("SELECT id FROM plans WHERE plan_id = ?", (plan_id,))
            ]
            with transaction(conn):
                conn.executemany("DELETE FROM events WHERE plan = ?", doomed)
                conn.executemany("DELETE FROM plan_bodies WHERE id = ?", doomed)
                conn.executemany("DELETE FROM plans WHERE id = ?", doomed)
                conn.executemany("DELETE FROM revisions WHERE plan_id = ?", ids)
                conn.executemany("DELETE FROM plan_index WHERE plan_id = ?", ids)
        except sqlite3.Error as exc:
            raise self._error("prune plans", exc) from exc
        self._rowids.clear()
        logger.info("state store %s: pruned %d finished plan(s)", self.path, len(doomed))
        return len(doomed)

    def _history(self, query: HistoryQuery) -> list[PlanSummary]:
        conn = self._connection()
        where, params = where_clause(
            query,
            mark="?",
            contains=lambda column, mark: f"instr(lower({column}), {mark}) > 0",
            journal_text=(
                "EXISTS (SELECT 1 FROM plans AS p JOIN plan_bodies AS b ON b.id = p.id "
                "WHERE p.plan_id = plan_index.plan_id AND instr(lower(b.plan_json), ?) > 0) "
                "OR EXISTS (SELECT 1 FROM plans AS p JOIN events AS e ON e.plan = p.id "
                "WHERE p.plan_id = plan_index.plan_id AND (instr(lower(e.output), ?) > 0 "
                "OR instr(lower(e.data), ?) > 0))"
            ),
        )
        try:
            rows = conn.execute(
                "SELECT id, plan_id, revision, status, goal, created, updated, trace_id, message "
                f"FROM plan_index WHERE {where} "
                f"ORDER BY id {'ASC' if query.oldest_first else 'DESC'} LIMIT ?",
                [*params, max(0, query.limit)],
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read the history", exc) from exc
        return [_summary(row) for row in rows]

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


def _insert_plan(
    conn: sqlite3.Connection,
    plan_id: str,
    revision: int,
    plan_type: str,
    plan_json: str,
    status: str,
    now: float,
    goal: str,
) -> bool:
    """Insert a plan revision and its body, and index it, inside the caller's transaction;
    False if stored."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO plans (plan_id, revision, plan_type, status, created, updated) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (plan_id, revision, plan_type, status, now, now),
    )
    if cursor.rowcount != 1:
        return False
    conn.execute(
        "INSERT INTO plan_bodies (id, plan_json) VALUES (?, ?)", (cursor.lastrowid, plan_json)
    )
    # A new revision keeps the plan's place in the history (its first row's number and time).
    conn.execute(
        _INDEX_INSERT + " ON CONFLICT (plan_id) DO UPDATE SET revision = excluded.revision, "
        "status = excluded.status, goal = excluded.goal, message = '', updated = excluded.updated "
        "WHERE excluded.revision > plan_index.revision",
        (plan_id, revision, status, goal, "", "", now, now),
    )
    return True


def _summary(row: Sequence[Any]) -> PlanSummary:
    return PlanSummary(
        plan_id=str(row[1]),
        revision=int(row[2]),
        status=PlanStatus(row[3]),
        goal=str(row[4]),
        created=float(row[5]),
        updated=float(row[6]),
        trace_id=str(row[7]),
        message=str(row[8]),
        cursor=int(row[0]),
    )
