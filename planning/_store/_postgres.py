"""``PostgresStateStore``: a ``StateStore`` on a PostgreSQL server, for agents that move nodes.

It keeps what ``SqliteStateStore`` keeps, in the same shape, with the same semantics: a plan
revision's JSON written once, an append-only journal of small rows (intent before effect: the
engine acts only after the commit holding an intent returned), one transaction per ``commit`` and
per ``save_revision``, the revision history, the circuit breakers, ``unfinished``, ``prune`` and
``stats``.

Namespacing: every store works in one PostgreSQL **schema** of its own (``schema=``, created when
missing), so the agents of a deployment share one database and never see each other's plans: the
runtime gives each role its own, e.g. ``stratagem_tactical``. Two stores on one schema are one
store (as two handles on one SQLite file are). The table names do not collide with those of
``protocol.PostgresAnswerStore`` and ``protocol.PostgresAuditLog``, so a role's answers may live in
its plans' schema.

Durability: a commit that returned is on the server's disk under PostgreSQL's default
``synchronous_commit=on`` (stronger than SQLite's ``synchronous=NORMAL``); the server, not the
agent's node, holds the state, so a node that dies takes nothing with it.

Connections come from the shared ``PostgresPool`` (``protocol._storage._postgres``: a
``psycopg_pool`` pool checked before each use, so a restarted server costs one failed connection,
not a broken store; ``psycopg`` errors become the ``StoreError`` family there). Writes are
serialised by the store (an ``asyncio.Lock``, first come first served) so commits are applied in
call order; reads run beside them on other connections.

Schema (version 2), in the store's schema::

    schema_versions(component, version)             one row per component sharing the schema:
                                                    'plans' for this store
    plans(id, plan_id, revision, plan_type, status, created, updated)
                                                    one row per (plan id, revision); status and
                                                    updated follow the journal
    plan_bodies(id, plan_json)                      the revision's plan, written once
    events(plan, seq, kind, step_id, attempt, status, output, data)
                                                    the append-only journal, one row per record,
                                                    in the row format of the SQLite store; seq is
                                                    an identity column
    revisions(plan_id, revision, parent, rationale, author, diff, carried, at)
                                                    the history of revisions made by a replan
    breakers(tool, failures, opened_at)             the engine's circuit breakers
    plan_index(id, plan_id, revision, status, goal, trace_id, message, created, updated)
                                                    the history: one row per plan, numbered in
                                                    creation order (``_history``; version 2)

``plan_bodies`` and ``events`` reference ``plans`` with ``ON DELETE CASCADE``: a journal never
outlives its plan, and a commit for a plan pruned meanwhile fails instead of leaving orphans.

Migrations are an ordered list of async functions (``MIGRATIONS``); the ``plans`` row of
``schema_versions`` says how many have run. The shared runner runs them in one transaction under a
transaction-level advisory lock keyed by the schema, so processes opening a store at once migrate
it once; opening a store whose version is newer than the list is a ``StoreSchemaError``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
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
from stratagem.planning._store._postgres_schema import (
    INDEX_INSERT,
    MIGRATIONS,
    Connection,
)
from stratagem.planning._store._rows import (
    compact_json,
    decode_record,
    encode_record,
)
from stratagem.planning._store._state import (
    BreakerState,
    PlanState,
    PlanStatusRecord,
    Record,
    StoreStats,
    fold,
)
from stratagem.protocol._storage._postgres import (
    PostgresPool,
    PostgresVersions,
    migrate_schema,
    q,
    schema_identifier,
)

__all__ = ["MIGRATIONS", "PostgresStateStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


COMPONENT: Final = "plans"
"""This store's row in ``schema_versions``."""

_FINAL: Final = [status.value for status in PlanStatus if status.is_final]
_TABLES: Final = ("plans", "plan_bodies", "events", "revisions", "breakers", "plan_index")


"""The schema migrations, oldest first; migration ``i`` (from 0) brings the schema to ``i + 1``."""


class PostgresStateStore:
    """A ``StateStore`` in one schema of a PostgreSQL database (psycopg 3, a connection pool).

    Use ``store = await PostgresStateStore.open(url, schema="stratagem_tactical")``, or
    ``async with PostgresStateStore(url, schema=...) as store:``, or call ``start``/``aclose``;
    the methods also open the pool on first use.

    Args:
        url: A libpq connection string or URL, e.g. ``postgresql://stratagem@db:5432/stratagem``.
        schema: The PostgreSQL schema holding this store's tables (created when missing); one
            per agent role.
        min_size: Connections the pool keeps open.
        max_size: The most connections the pool opens.
        timeout_s: How long a call waits for a connection (and ``start`` for the server).
        meter_provider: Where the commit latency histogram goes
            (``stratagem.store.commit.duration``, ``store=postgres``); the global provider by
            default.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str,
        min_size: int = 1,
        max_size: int = 4,
        timeout_s: float = 30.0,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._ident = schema_identifier(schema, error=StoreError)
        self.schema = schema
        self._pool = PostgresPool(
            url,
            schema=schema,
            what="state store",
            name=f"stratagem-store-{schema}",
            prepare=self._migrate,
            closed=lambda: StoreError("the state store is closed", location=self.location),
            min_size=min_size,
            max_size=max_size,
            timeout_s=timeout_s,
            errors=STORE_ERRORS,
        )
        self.location = self._pool.location
        self._metrics = PlanningMetrics(meter_provider)
        self._writing = asyncio.Lock()
        self._rowids: dict[tuple[str, int], int] = {}

    @classmethod
    async def open(cls, url: str, *, schema: str, **options: Any) -> PostgresStateStore:
        """A started store (see the class for the arguments).

        Raises:
            StoreSchemaError: When the schema is newer than this code knows, or a migration fails.
            StoreError: When the server cannot be reached.
        """
        store = cls(url, schema=schema, **options)
        await store.start()
        return store

    async def __aenter__(self) -> PostgresStateStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the pool and run pending migrations.

        Raises:
            StoreSchemaError: When the schema is newer than this code knows, or a migration fails.
            StoreError: When the server cannot be reached.
        """
        await self._pool.get()

    async def aclose(self) -> None:
        """Close the pool; further calls raise ``StoreError``."""
        await self._pool.aclose()

    async def schema_version(self) -> int:
        """The schema version of the open store."""

        async def read(conn: Connection) -> int:
            return await PostgresVersions(conn, self.schema, self.location).version(COMPONENT)

        return await self._read("read the schema version", read)

    async def save_plan(self, plan: Plan) -> bool:
        """See ``StateStore.save_plan``."""
        plan_json = plan.model_dump_json()
        plan_type = f"{type(plan).__module__}.{type(plan).__qualname__}"

        async def write(conn: Connection) -> bool:
            return await self._insert_plan(
                conn, plan.id, plan.revision, plan_type, plan_json, plan.goal
            )

        return await self._write(f"save plan {plan.id!r}", write)

    async def commit(self, records: Sequence[Record]) -> None:
        """See ``StateStore.commit``: one transaction for all of ``records``."""
        if not records:
            return
        batch = list(records)

        async def write(conn: Connection) -> None:
            await self._append(conn, batch)

        started = time.perf_counter()
        await self._write(f"commit {len(batch)} record(s)", write)
        self._metrics.commit_recorded("postgres", time.perf_counter() - started)

    async def save_revision(
        self, plan: Plan, record: RevisionRecord, records: Sequence[Record]
    ) -> None:
        """See ``StateStore.save_revision``: one transaction."""
        plan_json = plan.model_dump_json()
        plan_type = f"{type(plan).__module__}.{type(plan).__qualname__}"
        batch = list(records)

        async def write(conn: Connection) -> None:
            if not await self._insert_plan(
                conn, plan.id, plan.revision, plan_type, plan_json, plan.goal
            ):
                raise StoreError(
                    f"plan {plan.id!r} revision {plan.revision} is already stored",
                    location=self.location,
                )
            await conn.execute(
                q(
                    "INSERT INTO {s}.revisions "
                    "(plan_id, revision, parent, rationale, author, diff, carried, at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    self._ident,
                ),
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
            await self._append(conn, batch)

        await self._write(f"save revision {plan.revision} of plan {plan.id!r}", write)

    async def load(self, plan_id: str, revision: int | None = None) -> PlanState | None:
        """See ``StateStore.load``."""
        wanted = revision

        async def read(conn: Connection) -> PlanState | None:
            cursor = await conn.execute(
                q(
                    "SELECT p.id, p.revision, b.plan_json FROM {s}.plans AS p "
                    "JOIN {s}.plan_bodies AS b ON b.id = p.id WHERE p.plan_id = %s "
                    "AND (%s::integer IS NULL OR p.revision = %s) "
                    "ORDER BY p.revision DESC LIMIT 1",
                    self._ident,
                ),
                (plan_id, wanted, wanted),
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            rowid, revision, plan_json = int(row[0]), int(row[1]), str(row[2])
            rows = await self._events(conn, rowid)
            return fold(
                plan_id, revision, plan_json, (decode_record(plan_id, revision, r) for r in rows)
            )

        return await self._read(f"load plan {plan_id!r}", read)

    async def journal(self, plan_id: str, revision: int | None = None) -> list[Record]:
        """See ``StateStore.journal``."""

        async def read(conn: Connection) -> list[Record]:
            if revision is None:
                cursor = await conn.execute(
                    q(
                        "SELECT id, revision FROM {s}.plans WHERE plan_id = %s "
                        "ORDER BY revision DESC LIMIT 1",
                        self._ident,
                    ),
                    (plan_id,),
                )
            else:
                cursor = await conn.execute(
                    q(
                        "SELECT id, revision FROM {s}.plans WHERE plan_id = %s AND revision = %s",
                        self._ident,
                    ),
                    (plan_id, revision),
                )
            row = await cursor.fetchone()
            if row is None:
                return []
            rows = await self._events(conn, int(row[0]))
            return [decode_record(plan_id, int(row[1]), r) for r in rows]

        return await self._read(f"read the journal of plan {plan_id!r}", read)

    async def revisions(self, plan_id: str) -> list[RevisionRecord]:
        """See ``StateStore.revisions``."""

        async def read(conn: Connection) -> list[RevisionRecord]:
            cursor = await conn.execute(
                q(
                    "SELECT p.revision, p.created, r.parent, r.rationale, r.author, r.diff, "
                    "r.carried, r.at FROM {s}.plans AS p LEFT JOIN {s}.revisions AS r "
                    "ON r.plan_id = p.plan_id AND r.revision = p.revision "
                    "WHERE p.plan_id = %s ORDER BY p.revision",
                    self._ident,
                ),
                (plan_id,),
            )
            history = []
            for (
                revision,
                created,
                parent,
                rationale,
                author,
                diff,
                carried,
                at,
            ) in await cursor.fetchall():
                if at is None:  # a first revision: its plans row stands for it
                    history.append(RevisionRecord(plan_id, int(revision), None, at=float(created)))
                    continue
                history.append(
                    RevisionRecord(
                        plan_id,
                        int(revision),
                        None if parent is None else int(parent),
                        str(rationale),
                        str(author),
                        RevisionDiff.from_json(json.loads(diff)),
                        list(json.loads(carried)),
                        float(at),
                    )
                )
            return history

        return await self._read(f"read the revisions of plan {plan_id!r}", read)

    async def breakers(self) -> list[BreakerState]:
        """See ``StateStore.breakers``."""

        async def read(conn: Connection) -> list[BreakerState]:
            cursor = await conn.execute(
                q("SELECT tool, failures, opened_at FROM {s}.breakers ORDER BY tool", self._ident)
            )
            return [
                BreakerState(str(r[0]), int(r[1]), None if r[2] is None else float(r[2]))
                for r in await cursor.fetchall()
            ]

        return await self._read("read the circuit breakers", read)

    async def save_breaker(self, state: BreakerState) -> None:
        """See ``StateStore.save_breaker``."""

        async def write(conn: Connection) -> None:
            await conn.execute(
                q(
                    "INSERT INTO {s}.breakers (tool, failures, opened_at) VALUES (%s, %s, %s) "
                    "ON CONFLICT (tool) DO UPDATE SET failures = EXCLUDED.failures, "
                    "opened_at = EXCLUDED.opened_at",
                    self._ident,
                ),
                (state.tool, state.failures, state.opened_at),
            )

        await self._write(f"save the circuit breaker of tool {state.tool!r}", write)

    async def unfinished(self) -> list[str]:
        """See ``StateStore.unfinished``."""

        async def read(conn: Connection) -> list[str]:
            cursor = await conn.execute(
                q(
                    "SELECT plan_id FROM {s}.plans AS p WHERE status <> ALL (%s) AND revision = "
                    "(SELECT max(revision) FROM {s}.plans WHERE plan_id = p.plan_id) "
                    "ORDER BY created, id",
                    self._ident,
                ),
                (_FINAL,),
            )
            return list(dict.fromkeys(str(r[0]) for r in await cursor.fetchall()))

        return await self._read("list unfinished plans", read)

    async def prune(self, *, before: float | None = None, keep_last: int | None = None) -> int:
        """See ``StateStore.prune``."""

        async def write(conn: Connection) -> int:
            cursor = await conn.execute(
                q(
                    "SELECT plan_id, updated FROM {s}.plans AS p WHERE status = ANY (%s) AND "
                    "revision = (SELECT max(revision) FROM {s}.plans WHERE plan_id = p.plan_id) "
                    "ORDER BY updated DESC",
                    self._ident,
                ),
                (_FINAL,),
            )
            rows = await cursor.fetchall()
            candidates = rows[keep_last:] if keep_last else rows
            ids = [str(r[0]) for r in candidates if before is None or float(r[1]) < before]
            if not ids:
                return 0
            # The journals and bodies go with their plans rows (ON DELETE CASCADE).
            cursor = await conn.execute(
                q("DELETE FROM {s}.plans WHERE plan_id = ANY (%s)", self._ident), (ids,)
            )
            deleted = cursor.rowcount
            await conn.execute(
                q("DELETE FROM {s}.revisions WHERE plan_id = ANY (%s)", self._ident), (ids,)
            )
            await conn.execute(
                q("DELETE FROM {s}.plan_index WHERE plan_id = ANY (%s)", self._ident), (ids,)
            )
            return deleted

        deleted = await self._write("prune plans", write)
        self._rowids.clear()
        if deleted:
            logger.info("state store %s: pruned %d finished plan(s)", self.location, deleted)
        return deleted

    async def history(self, query: HistoryQuery) -> list[PlanSummary]:
        """See ``StateStore.history``."""
        where, params = where_clause(
            query,
            mark="%s",
            contains=lambda column, mark: f"strpos(lower({column}), {mark}) > 0",
            journal_text=(
                "EXISTS (SELECT 1 FROM {s}.plans AS p JOIN {s}.plan_bodies AS b ON b.id = p.id "
                "WHERE p.plan_id = i.plan_id AND strpos(lower(b.plan_json), %s) > 0) "
                "OR EXISTS (SELECT 1 FROM {s}.plans AS p JOIN {s}.events AS e ON e.plan = p.id "
                "WHERE p.plan_id = i.plan_id AND (strpos(lower(e.output), %s) > 0 "
                "OR strpos(lower(e.data), %s) > 0))"
            ),
        )
        statement = (
            "SELECT id, plan_id, revision, status, goal, created, updated, trace_id, message "
            f"FROM {{s}}.plan_index AS i WHERE {where} "
            f"ORDER BY id {'ASC' if query.oldest_first else 'DESC'} LIMIT %s"
        )

        async def read(conn: Connection) -> list[PlanSummary]:
            cursor = await conn.execute(q(statement, self._ident), [*params, max(0, query.limit)])
            return [
                PlanSummary(
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
                for row in await cursor.fetchall()
            ]

        return await self._read("read the history", read)

    async def stats(self) -> StoreStats:
        """See ``StateStore.stats``; ``bytes`` is the tables' total size, indexes included."""

        async def read(conn: Connection) -> StoreStats:
            cursor = await conn.execute(
                q(
                    "SELECT (SELECT count(*) FROM {s}.plans), (SELECT count(*) FROM {s}.events)",
                    self._ident,
                )
            )
            counts = await cursor.fetchone()
            cursor = await conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname = ANY (%s)",
                (self.schema, list(_TABLES)),
            )
            size = await cursor.fetchone()
            # Aggregates always return a row.
            assert counts is not None
            assert size is not None
            return StoreStats(plans=int(counts[0]), records=int(counts[1]), bytes=int(size[0]))

        return await self._read("measure the store", read)

    # --- connections and transactions ----------------------------------------------------------

    async def _migrate(self, conn: Connection) -> None:
        await migrate_schema(
            conn,
            self.schema,
            COMPONENT,
            MIGRATIONS,
            location=self.location,
            what="state store",
            errors=STORE_ERRORS,
        )

    async def _read(self, action: str, fn: Callable[[Connection], Awaitable[T]]) -> T:
        async with self._pool.connection(action) as conn:
            return await fn(conn)

    async def _write(self, action: str, fn: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction, after the writes called before it."""
        async with self._writing:
            try:
                async with self._pool.connection(action) as conn, conn.transaction():
                    return await fn(conn)
            except StoreError:
                # A cached row id may belong to a plan deleted by another process.
                self._rowids.clear()
                raise

    # --- inside a transaction ------------------------------------------------------------------

    async def _insert_plan(
        self,
        conn: Connection,
        plan_id: str,
        revision: int,
        plan_type: str,
        plan_json: str,
        goal: str,
    ) -> bool:
        """Insert a plan revision and its body, and index it; False when it is stored already."""
        now = time.time()
        cursor = await conn.execute(
            q(
                "INSERT INTO {s}.plans (plan_id, revision, plan_type, status, created, updated) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (plan_id, revision) DO NOTHING "
                "RETURNING id",
                self._ident,
            ),
            (plan_id, revision, plan_type, PlanStatus.PENDING.value, now, now),
        )
        row = await cursor.fetchone()
        if row is None:
            return False
        await conn.execute(
            q("INSERT INTO {s}.plan_bodies (id, plan_json) VALUES (%s, %s)", self._ident),
            (row[0], plan_json),
        )
        # A new revision keeps the plan's place in the history (its first row's number and time).
        await conn.execute(
            q(
                INDEX_INSERT.replace("plan_index", "plan_index AS i", 1)
                + " ON CONFLICT (plan_id) DO UPDATE SET revision = EXCLUDED.revision, "
                "status = EXCLUDED.status, goal = EXCLUDED.goal, message = '', "
                "updated = EXCLUDED.updated WHERE EXCLUDED.revision > i.revision",
                self._ident,
            ),
            (plan_id, revision, PlanStatus.PENDING.value, goal, "", "", now, now),
        )
        return True

    async def _rowid_map(
        self, conn: Connection, records: list[Record]
    ) -> dict[tuple[str, int], int]:
        keys = {(r.plan_id, r.revision) for r in records}
        missing = [key for key in keys if key not in self._rowids]
        if missing:
            cursor = await conn.execute(
                q(
                    "SELECT p.plan_id, p.revision, p.id FROM {s}.plans AS p "
                    "JOIN unnest(%s::text[], %s::integer[]) AS k (plan_id, revision) "
                    "ON p.plan_id = k.plan_id AND p.revision = k.revision",
                    self._ident,
                ),
                ([k[0] for k in missing], [k[1] for k in missing]),
            )
            for plan_id, revision, rowid in await cursor.fetchall():
                self._rowids[(str(plan_id), int(revision))] = int(rowid)
        unknown = sorted(key for key in keys if key not in self._rowids)
        if unknown:
            plan_id, revision = unknown[0]
            raise StoreError(
                f"plan {plan_id!r} revision {revision} was never saved", location=self.location
            )
        return {key: self._rowids[key] for key in keys}

    async def _append(self, conn: Connection, records: list[Record]) -> None:
        """Insert ``records`` in order and follow their plans' status (caller's transaction)."""
        if not records:
            return
        rowids = await self._rowid_map(conn, records)
        rows = []
        statuses: dict[int, PlanStatusRecord] = {}
        traces: dict[int, str] = {}  # the batch's first trace of each plan
        for record in records:
            rowid = rowids[(record.plan_id, record.revision)]
            rows.append((rowid, *encode_record(record)))
            if isinstance(record, PlanStatusRecord):
                statuses[rowid] = record
                if record.trace_context and rowid not in traces:
                    traces[rowid] = trace_id_of(record.trace_context)
        # Row by row in one pipeline (one round trip): the identity column numbers them in order.
        async with conn.cursor() as cursor:
            await cursor.executemany(
                q(
                    "INSERT INTO {s}.events (plan, kind, step_id, attempt, status, output, data) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    self._ident,
                ),
                rows,
            )
        if statuses:
            await conn.execute(
                q(
                    "UPDATE {s}.plans AS p SET status = u.status, updated = u.updated FROM "
                    "unnest(%s::bigint[], %s::text[], %s::double precision[]) AS u "
                    "(id, status, updated) WHERE p.id = u.id",
                    self._ident,
                ),
                (
                    list(statuses),
                    [r.status.value for r in statuses.values()],
                    [r.at for r in statuses.values()],
                ),
            )
            await conn.execute(
                q(
                    "UPDATE {s}.plan_index AS i SET status = u.status, updated = u.updated, "
                    "message = u.message, trace_id = CASE WHEN i.trace_id = '' THEN u.trace_id "
                    "ELSE i.trace_id END FROM unnest(%s::text[], %s::integer[], %s::text[], "
                    "%s::double precision[], %s::text[], %s::text[]) AS u "
                    "(plan_id, revision, status, updated, message, trace_id) "
                    "WHERE i.plan_id = u.plan_id AND i.revision = u.revision",
                    self._ident,
                ),
                (
                    [r.plan_id for r in statuses.values()],
                    [r.revision for r in statuses.values()],
                    [r.status.value for r in statuses.values()],
                    [r.at for r in statuses.values()],
                    [r.message for r in statuses.values()],
                    [traces.get(rowid, "") for rowid in statuses],
                ),
            )

    async def _events(self, conn: Connection, rowid: int) -> list[tuple[Any, ...]]:
        cursor = await conn.execute(
            q(
                "SELECT kind, step_id, attempt, status, output, data FROM {s}.events "
                "WHERE plan = %s ORDER BY seq",
                self._ident,
            ),
            (rowid,),
        )
        return await cursor.fetchall()
