"""The PostgreSQL state store's schema: its migrations, in order (``MIGRATIONS``), and the one
statement that writes a plan's history row (``INDEX_INSERT``, with ``index_values``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from psycopg import sql

from stratagem.planning._store._rows import IndexRow, decode_record, index_row
from stratagem.protocol._storage._postgres import AsyncConnection, q

Connection = AsyncConnection
Migration = Callable[[Connection, sql.Identifier], Awaitable[None]]


async def _migrate_v1(conn: Connection, schema: sql.Identifier) -> None:
    await conn.execute(
        q(
            """CREATE TABLE {s}.plans (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                plan_id TEXT NOT NULL,
                revision INTEGER NOT NULL,
                plan_type TEXT NOT NULL,
                status TEXT NOT NULL,
                created DOUBLE PRECISION NOT NULL,
                updated DOUBLE PRECISION NOT NULL,
                UNIQUE (plan_id, revision)
            )""",
            schema,
        )
    )
    await conn.execute(q("CREATE INDEX plans_by_status ON {s}.plans (status, updated)", schema))
    await conn.execute(
        q(
            """CREATE TABLE {s}.plan_bodies (
                id BIGINT PRIMARY KEY REFERENCES {s}.plans (id) ON DELETE CASCADE,
                plan_json TEXT NOT NULL
            )""",
            schema,
        )
    )
    # Keyed by plan first: a plan's journal is one index range to read on load.
    await conn.execute(
        q(
            """CREATE TABLE {s}.events (
                plan BIGINT NOT NULL REFERENCES {s}.plans (id) ON DELETE CASCADE,
                seq BIGINT GENERATED ALWAYS AS IDENTITY,
                kind SMALLINT NOT NULL,
                step_id TEXT,
                attempt INTEGER,
                status TEXT,
                output TEXT,
                data TEXT,
                PRIMARY KEY (plan, seq)
            )""",
            schema,
        )
    )
    await conn.execute(
        q(
            """CREATE TABLE {s}.revisions (
                plan_id TEXT NOT NULL,
                revision INTEGER NOT NULL,
                parent INTEGER,
                rationale TEXT NOT NULL,
                author TEXT NOT NULL,
                diff TEXT NOT NULL,
                carried TEXT NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (plan_id, revision)
            )""",
            schema,
        )
    )
    await conn.execute(
        q(
            """CREATE TABLE {s}.breakers (
                tool TEXT PRIMARY KEY,
                failures INTEGER NOT NULL,
                opened_at DOUBLE PRECISION
            )""",
            schema,
        )
    )


async def _migrate_v2(conn: Connection, schema: sql.Identifier) -> None:
    # The history: one row per plan (see ``_history``), numbered in creation order, filled for
    # the plans stored before it from their newest revision and their status records.
    await conn.execute(
        q(
            """CREATE TABLE {s}.plan_index (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                plan_id TEXT NOT NULL UNIQUE,
                revision INTEGER NOT NULL,
                status TEXT NOT NULL,
                goal TEXT NOT NULL,
                trace_id TEXT NOT NULL,
                message TEXT NOT NULL,
                created DOUBLE PRECISION NOT NULL,
                updated DOUBLE PRECISION NOT NULL
            )""",
            schema,
        )
    )
    await conn.execute(q("CREATE INDEX plan_index_by_trace ON {s}.plan_index (trace_id)", schema))
    cursor = await conn.execute(
        q(
            "SELECT p.plan_id, p.revision, p.updated, b.plan_json, "
            "(SELECT min(created) FROM {s}.plans WHERE plan_id = p.plan_id) AS first "
            "FROM {s}.plans AS p JOIN {s}.plan_bodies AS b ON b.id = p.id WHERE p.revision = "
            "(SELECT max(revision) FROM {s}.plans WHERE plan_id = p.plan_id) ORDER BY first, p.id",
            schema,
        )
    )
    for plan_id, revision, updated, plan_json, created in await cursor.fetchall():
        statuses = await conn.execute(
            q(
                "SELECT p.revision, e.kind, e.step_id, e.attempt, e.status, e.output, e.data "
                "FROM {s}.events AS e JOIN {s}.plans AS p ON p.id = e.plan "
                "WHERE p.plan_id = %s AND e.kind = 1 ORDER BY e.seq",
                schema,
            ),
            (plan_id,),
        )
        row = index_row(
            str(plan_id),
            int(revision),
            str(plan_json),
            float(created),
            float(updated),
            [decode_record(str(plan_id), int(r[0]), r[1:]) for r in await statuses.fetchall()],
        )
        await conn.execute(q(INDEX_INSERT, schema), index_values(row))


INDEX_INSERT: Final = (
    "INSERT INTO {s}.plan_index (plan_id, revision, status, goal, trace_id, message, created, "
    "updated) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)


def index_values(row: IndexRow) -> tuple[object, ...]:
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


MIGRATIONS: Final[list[Migration]] = [_migrate_v1, _migrate_v2]
