"""``PostgresAnswerStore``: answers in a PostgreSQL schema, kept across restarts and nodes.

It keeps what ``SqliteAnswerStore`` keeps, with the same semantics, on a server every node of a
cluster reaches: an agent that restarts on another node finds its answers where it left them.
Answers are keyed by (caller, request id) only, so each agent role needs a schema of its own for
them (the runtime uses the role's plans schema: the table names differ from ``planning``'s).

Schema (version 1; ``schema_versions`` has one row per component)::

    schema_versions(component, version)     'answers' (and the other components of the schema)
    answers(caller, request_id, request_digest, answer, stored_at)

The pool, the migrations (``MIGRATIONS``, run by the shared runner under the schema's lock) and
the translation of ``psycopg`` errors into ``StorageError`` are the shared PostgreSQL seam's
(``protocol._storage._postgres``). Durability: a commit that returned is on the server's disk
under PostgreSQL's default ``synchronous_commit=on``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from psycopg import sql

from stratagem.protocol._answers._store import AnswerRetention, StoredAnswer
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage._postgres import (
    AsyncConnection,
    PostgresPool,
    migrate_schema,
    q,
    schema_identifier,
)

__all__ = ["MIGRATIONS", "PostgresAnswerStore"]

# Expired and surplus answers are dropped on every this-many puts (and when a store opens).
_PRUNE_EVERY: Final = 256


async def _migrate_v1(conn: AsyncConnection, schema: sql.Identifier) -> None:
    await conn.execute(
        q(
            """CREATE TABLE IF NOT EXISTS {s}.answers (
                caller TEXT NOT NULL,
                request_id TEXT NOT NULL,
                request_digest TEXT NOT NULL,
                answer BYTEA NOT NULL,
                stored_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (caller, request_id)
            )""",
            schema,
        )
    )
    await conn.execute(
        q("CREATE INDEX IF NOT EXISTS answers_by_age ON {s}.answers (stored_at)", schema)
    )


MIGRATIONS: Final = [_migrate_v1]
"""The schema migrations, oldest first (component ``answers``)."""


class PostgresAnswerStore:
    """Answers in a PostgreSQL schema, kept across restarts and nodes.

    Retention applies all three bounds of ``AnswerRetention``: answers older than ``max_age_s``
    are never served, and every ``_PRUNE_EVERY`` puts (and on ``prune``) the expired ones and the
    oldest beyond ``max_entries`` or beyond ``max_bytes`` of answers are deleted. An answer larger
    than ``max_bytes`` is not kept.

    Use ``await PostgresAnswerStore.open(url, schema=...)``, ``async with``, or ``start``; the
    methods also open the pool on first use.

    Args:
        url: A libpq connection string or URL.
        retention: The bounds; ``AnswerRetention()`` by default.
        schema: The PostgreSQL schema of this agent's answers (one per role).
        clock: Seconds since the epoch (inject one in tests).
        max_size: The most connections the pool opens.
        timeout_s: How long a call waits for a connection (and ``start`` for the server).
    """

    def __init__(
        self,
        url: str,
        retention: AnswerRetention | None = None,
        *,
        schema: str,
        clock: Callable[[], float] = time.time,
        max_size: int = 4,
        timeout_s: float = 30.0,
    ) -> None:
        self._ident = schema_identifier(schema)
        self.schema = schema
        self._pool = PostgresPool(
            url,
            schema=schema,
            what="answer store",
            name=f"stratagem-answers-{schema}",
            prepare=self._prepare,
            closed=lambda: ProtocolUsageError(f"the answer store {self.location} is closed"),
            max_size=max_size,
            timeout_s=timeout_s,
        )
        self.location = self._pool.location
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._puts = 0

    @classmethod
    async def open(
        cls,
        url: str,
        retention: AnswerRetention | None = None,
        *,
        schema: str,
        **options: Any,
    ) -> PostgresAnswerStore:
        """A started store (see the class for the arguments)."""
        store = cls(url, retention, schema=schema, **options)
        await store.start()
        return store

    async def start(self) -> None:
        """Open the pool, create or check the schema, and drop what retention no longer keeps.

        Raises:
            StorageSchemaError: When the schema holds answers of a newer schema version (a
                ``ProtocolUsageError`` too).
            StorageError: When the server cannot be reached.
        """
        await self._pool.get()

    async def __aenter__(self) -> PostgresAnswerStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _prepare(self, conn: AsyncConnection) -> None:
        await migrate_schema(
            conn, self.schema, "answers", MIGRATIONS, location=self.location, what="answer store"
        )
        await self._prune(conn)

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``)."""
        horizon = self._clock() - self._retention.max_age_s
        async with self._pool.connection("read an answer") as conn:
            cursor = await conn.execute(
                q(
                    "SELECT request_digest, answer, stored_at FROM {s}.answers "
                    "WHERE caller = %s AND request_id = %s AND stored_at >= %s",
                    self._ident,
                ),
                (caller, request_id, horizon),
            )
            row = await cursor.fetchone()
        return None if row is None else StoredAnswer(str(row[0]), bytes(row[1]), float(row[2]))

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Commit an answer; every ``_PRUNE_EVERY`` puts, drop what retention no longer keeps."""
        retention = self._retention
        if retention.max_entries == 0 or len(answer) > retention.max_bytes:
            return
        self._puts += 1
        prune = self._puts % _PRUNE_EVERY == 0
        stored_at = self._clock()
        async with self._pool.connection("store an answer") as conn:
            await conn.execute(
                q(
                    "INSERT INTO {s}.answers (caller, request_id, request_digest, answer, "
                    "stored_at) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (caller, request_id) "
                    "DO UPDATE SET request_digest = EXCLUDED.request_digest, "
                    "answer = EXCLUDED.answer, stored_at = EXCLUDED.stored_at",
                    self._ident,
                ),
                (caller, request_id, request_digest, answer, stored_at),
            )
            if prune:
                await self._prune(conn)

    async def prune(self) -> int:
        """Drop expired answers and the oldest beyond ``max_entries`` or ``max_bytes``; how many."""
        async with self._pool.connection("prune the answers") as conn:
            return await self._prune(conn)

    async def count(self) -> int:
        """How many answers are stored."""
        async with self._pool.connection("count the answers") as conn:
            cursor = await conn.execute(q("SELECT count(*) FROM {s}.answers", self._ident))
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def _prune(self, conn: AsyncConnection) -> int:
        retention = self._retention
        horizon = self._clock() - retention.max_age_s
        # Newest first: an answer goes when it is expired, or when it and the newer ones exceed
        # the count or the bytes kept.
        cursor = await conn.execute(
            q(
                "DELETE FROM {s}.answers AS a USING (SELECT caller, request_id, "
                "row_number() OVER w AS n, sum(octet_length(answer)) OVER w AS total "
                "FROM {s}.answers WINDOW w AS (ORDER BY stored_at DESC, caller, request_id)) AS k "
                "WHERE a.caller = k.caller AND a.request_id = k.request_id "
                "AND (a.stored_at < %s OR k.n > %s OR k.total > %s)",
                self._ident,
            ),
            (horizon, retention.max_entries, retention.max_bytes),
        )
        return max(cursor.rowcount, 0)

    async def aclose(self) -> None:
        """Close the pool; later calls raise ``ProtocolUsageError``."""
        await self._pool.aclose()
