"""Memory in PostgreSQL, for clusters whose agents move between nodes: full-text recall with a
GIN index.

With ``STRATAGEM_STORE_URL`` the deployment's memory lives in its shared schema (``stratagem``,
beside the audit log), one table every agent and the operator reach. Requires the ``postgres``
extra: ``agents`` exports the class on first use.

Schema (component ``memory``, version 1)::

    memory_items(namespace, key, value, body, tsv, created_at, updated_at, expires_at)
        primary key (namespace, key); namespace in the "C" collation, its parts joined and ended
        by "/" ("user/ana/"), so a namespace and every namespace below it is one index range;
        value is JSONB; tsv is to_tsvector('english', body), generated, with a GIN index

Recall matches any word of the query (``to_tsquery`` over the words, OR-ed: the query is never
tsquery syntax), ranked by ``ts_rank_cd`` (``score``). Filters compare ``value #> path`` with the
JSON scalar as JSONB (JSON equality: ``1`` equals ``1.0``, ``true`` is not ``1``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from psycopg import sql

from stratagem.agents._memory._model import (
    DEFAULT_LIMITS,
    JsonValue,
    MemoryItem,
    MemoryLimits,
    check_filter,
    check_key,
    check_limit,
    check_namespace,
    check_offset,
    check_query,
    check_ttl,
    encode_value,
    searchable_text,
)
from stratagem.agents._memory._sqlite import namespace_range
from stratagem.agents._memory._store import query_terms
from stratagem.agents._memory._vectors import VECTOR_SCAN_LIMIT, Embedder, pack, rank
from stratagem.protocol import StorageError
from stratagem.protocol._storage._postgres import (
    AsyncConnection,
    PostgresPool,
    migrate_schema,
    q,
    schema_identifier,
)

__all__ = ["MIGRATIONS", "PostgresMemoryStore"]

_SWEEP_EVERY: Final = 256
_COLUMNS: Final = "namespace, key, value::text, created_at, updated_at, expires_at"


async def _migrate_v1(conn: AsyncConnection, schema: sql.Identifier) -> None:
    await conn.execute(
        q(
            """CREATE TABLE {s}.memory_items (
                namespace TEXT COLLATE "C" NOT NULL,
                key TEXT NOT NULL,
                value JSONB NOT NULL,
                body TEXT NOT NULL,
                tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', body)) STORED,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION,
                embedding BYTEA,
                PRIMARY KEY (namespace, key)
            )""",
            schema,
        )
    )
    await conn.execute(
        q("CREATE INDEX memory_items_tsv ON {s}.memory_items USING GIN (tsv)", schema)
    )
    await conn.execute(
        q("CREATE INDEX memory_items_recent ON {s}.memory_items (updated_at)", schema)
    )
    await conn.execute(
        q(
            "CREATE INDEX memory_items_expiry ON {s}.memory_items (expires_at) "
            "WHERE expires_at IS NOT NULL",
            schema,
        )
    )


MIGRATIONS: Final = [_migrate_v1]
"""The memory table's migrations, oldest first (component ``memory``)."""


def _item(row: Sequence[Any], score: float | None = None) -> MemoryItem:
    namespace, key, value, created, updated, expires = row[:6]
    return MemoryItem(
        namespace=tuple(str(namespace)[:-1].split("/")),
        key=str(key),
        value=json.loads(value),
        created_at=datetime.fromtimestamp(created, UTC),
        updated_at=datetime.fromtimestamp(updated, UTC),
        expires_at=None if expires is None else datetime.fromtimestamp(expires, UTC),
        score=score,
    )


def _filter_sql(filter: Mapping[str, JsonValue]) -> tuple[str, list[Any]]:
    clauses = ""
    params: list[Any] = []
    for path, wanted in filter.items():
        clauses += " AND (value #> %s) = %s::jsonb"
        params += [path.split("."), json.dumps(wanted)]
    return clauses, params


class PostgresMemoryStore:
    """``MemoryStore`` in a PostgreSQL schema.

    Args:
        url: A libpq connection string or URL.
        schema: The schema (created when missing; ``stratagem`` in a deployment).
        limits: What it accepts.
        clock: Seconds since the epoch (tests pass a fake one to expire items).
        max_size: The most connections the pool opens.
        timeout_s: How long a call waits for a connection (and ``start`` for the server).
        embedder: Where vectors come from; with one, ``search`` with a query recalls by cosine
            similarity (``_vectors``), else by full text.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "stratagem",
        limits: MemoryLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        max_size: int = 4,
        timeout_s: float = 30.0,
        embedder: Embedder | None = None,
    ) -> None:
        self.embedder = embedder
        self._ident = schema_identifier(schema)
        self.schema = schema
        self._pool = PostgresPool(
            url,
            schema=schema,
            what="memory store",
            name=f"stratagem-memory-{schema}",
            prepare=self._prepare,
            closed=lambda: StorageError(
                f"the memory store {self.location} is closed", location=self.location
            ),
            max_size=max_size,
            timeout_s=timeout_s,
        )
        self.location = self._pool.location
        self.limits = limits
        self._clock = clock
        self._writes = 0

    async def _prepare(self, conn: AsyncConnection) -> None:
        await migrate_schema(
            conn, self.schema, "memory", MIGRATIONS, location=self.location, what="memory store"
        )

    async def start(self) -> None:
        await self._pool.get()

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _q(self, text: str) -> sql.Composed:
        return q(text, self._ident)

    async def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: JsonValue,
        *,
        ttl_s: float | None = None,
    ) -> MemoryItem:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        text = encode_value(value, self.limits)
        ttl = check_ttl(ttl_s)
        body = searchable_text(key, json.loads(text))
        stored_ns = namespace_range(ns)[0]
        vector = None if self.embedder is None else pack((await self.embedder.embed([body]))[0])
        now = self._clock()
        expires = None if ttl is None else now + ttl
        async with self._pool.connection("write memory") as conn, conn.transaction():
            await conn.execute(
                self._q(
                    "DELETE FROM {s}.memory_items WHERE namespace = %s AND key = %s "
                    "AND expires_at IS NOT NULL AND expires_at <= %s"
                ),
                (stored_ns, key, now),
            )
            cursor = await conn.execute(
                self._q(
                    "INSERT INTO {s}.memory_items (namespace, key, value, body, created_at, "
                    "updated_at, expires_at, embedding) "
                    "VALUES (%s, %s, %s::jsonb, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, "
                    "body = EXCLUDED.body, updated_at = EXCLUDED.updated_at, "
                    "expires_at = EXCLUDED.expires_at, embedding = EXCLUDED.embedding "
                    f"RETURNING {_COLUMNS}"
                ),
                (stored_ns, key, text, body, now, now, expires, vector),
            )
            row = await cursor.fetchone()
        assert row is not None
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 0:
            await self.sweep()
        return _item(row)

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        async with self._pool.connection("delete memory") as conn:
            cursor = await conn.execute(
                self._q(
                    "DELETE FROM {s}.memory_items WHERE namespace = %s AND key = %s "
                    "RETURNING expires_at"
                ),
                (namespace_range(ns)[0], key),
            )
            row = await cursor.fetchone()
        return row is not None and (row[0] is None or row[0] > self._clock())

    async def sweep(self) -> int:
        async with self._pool.connection("sweep memory") as conn:
            cursor = await conn.execute(
                self._q(
                    "DELETE FROM {s}.memory_items WHERE expires_at IS NOT NULL AND expires_at <= %s"
                ),
                (self._clock(),),
            )
            return cursor.rowcount

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        async with self._pool.connection("read memory") as conn:
            cursor = await conn.execute(
                self._q(
                    f"SELECT {_COLUMNS} FROM {{s}}.memory_items WHERE namespace = %s "
                    "AND key = %s AND (expires_at IS NULL OR expires_at > %s)"
                ),
                (namespace_range(ns)[0], key, self._clock()),
            )
            row = await cursor.fetchone()
        return None if row is None else _item(row)

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        ns = check_namespace(namespace, self.limits)
        check_limit(limit, self.limits)
        check_offset(offset)
        low, high = namespace_range(ns)
        async with self._pool.connection("list memory") as conn:
            cursor = await conn.execute(
                self._q(
                    f"SELECT {_COLUMNS} FROM {{s}}.memory_items WHERE namespace >= %s "
                    "AND namespace < %s AND (expires_at IS NULL OR expires_at > %s) "
                    "ORDER BY namespace, key LIMIT %s OFFSET %s"
                ),
                (low, high, self._clock(), limit, offset),
            )
            rows = await cursor.fetchall()
        return [_item(row) for row in rows]

    async def search(
        self,
        namespace: Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        ns = check_namespace(namespace, self.limits)
        terms = query_terms(check_query(query))
        where, params = _filter_sql(check_filter(filter))
        check_limit(limit, self.limits)
        low, high = namespace_range(ns)
        live = "namespace >= %s AND namespace < %s AND (expires_at IS NULL OR expires_at > %s)"
        if self.embedder is not None and terms:
            wanted = (await self.embedder.embed([query or ""]))[0]
            async with self._pool.connection("search memory") as conn:
                cursor = await conn.execute(
                    self._q(
                        f"SELECT {_COLUMNS}, embedding FROM {{s}}.memory_items "
                        f"WHERE {live}{where} AND embedding IS NOT NULL "
                        "ORDER BY updated_at DESC LIMIT %s"
                    ),
                    (low, high, self._clock(), *params, VECTOR_SCAN_LIMIT),
                    prepare=False,
                )
                candidates = await cursor.fetchall()
            best = await asyncio.to_thread(
                rank, wanted, ((bytes(row[6]), row) for row in candidates), limit
            )
            return [_item(row, score) for score, row in best]
        async with self._pool.connection("search memory") as conn:
            if terms:
                cursor = await conn.execute(
                    self._q(
                        f"SELECT {_COLUMNS}, ts_rank_cd(tsv, query) AS score "
                        "FROM {s}.memory_items, to_tsquery('english', %s) AS query "
                        f"WHERE tsv @@ query AND {live}{where} "
                        "ORDER BY score DESC, namespace, key LIMIT %s"
                    ),
                    (" | ".join(terms), low, high, self._clock(), *params, limit),
                    # A generic plan (psycopg prepares after 5 runs) cannot tell a broad
                    # namespace from a narrow one and scans the namespace index: plan each.
                    prepare=False,
                )
            else:
                cursor = await conn.execute(
                    self._q(
                        f"SELECT {_COLUMNS}, NULL::float8 AS score FROM {{s}}.memory_items "
                        f"WHERE {live}{where} ORDER BY updated_at DESC, namespace, key LIMIT %s"
                    ),
                    (low, high, self._clock(), *params, limit),
                    prepare=False,
                )
            rows = await cursor.fetchall()
        return [_item(row, None if row[6] is None else float(row[6])) for row in rows]
