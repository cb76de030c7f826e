"""The answer store and the audit log on a PostgreSQL server (psycopg 3 with a connection pool).

``PostgresAnswerStore`` and ``PostgresAuditLog`` keep what ``SqliteAnswerStore`` and
``SqliteAuditLog`` keep, with the same semantics, on a server every node of a cluster reaches:
an agent that restarts on another node finds its answers and the audit chain where it left them.

Namespacing: each works in a PostgreSQL **schema** (``schema=``, created when missing). Answers are
keyed by (caller, request id) only, so each agent role needs a schema of its own for them (the
runtime may use the role's plans schema: the table names differ from ``planning``'s). The audit log
is one chain for the whole deployment, like the one SQLite file it replaces: every agent appends to
the same schema (``"stratagem"`` by default).

Schema (version 1 of each component; ``schema_versions`` has one row per component)::

    schema_versions(component, version)     'answers' and 'audit' (and 'plans', for planning's)
    answers(caller, request_id, request_digest, answer, stored_at)
    audit(seq, ts, actor, action, target, capability, request_id, code, detail, digest,
          prev_hash, hash)                  append-only: triggers refuse UPDATE, DELETE, TRUNCATE
    audit_lock(id)                          one row; appenders lock it (``SELECT ... FOR UPDATE``)

Concurrent audit writers: every transaction that appends first locks the one ``audit_lock`` row,
then reads the last record and writes its own after it. Writers in other threads, processes or
nodes wait for that row lock, and under ``READ COMMITTED`` the read that follows it sees every
record committed before, so the chain never forks (the primary key on ``seq`` would refuse a fork
anyway). ``append_async`` hands records to the log's writer thread, which commits everything queued
meanwhile in one transaction (group commit), like ``SqliteAuditLog``.

Durability: a commit that returned is on the server's disk under PostgreSQL's default
``synchronous_commit=on``, so an answer or a record survives a crash of the agent, of its node and
of the server. Errors of the server or the connection are raised as ``psycopg.Error`` (as the
SQLite stores raise ``sqlite3.Error``); calls after closing raise ``ProtocolUsageError``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from stratagem.protocol._answers import AnswerRetention, StoredAnswer
from stratagem.protocol._audit import (
    _COLUMNS,
    GENESIS,
    AuditRecord,
    _chain,
    _Entry,
    _GroupCommitLog,
)
from stratagem.protocol._errors import ProtocolUsageError

__all__ = ["PostgresAnswerStore", "PostgresAuditHeads", "PostgresAuditLog"]

logger = logging.getLogger(__name__)

AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]
Connection = psycopg.Connection[tuple[Any, ...]]

ANSWERS_VERSION: Final = 1
AUDIT_VERSION: Final = 1
# Expired and surplus answers are dropped on every this-many puts (and when a store opens).
_PRUNE_EVERY: Final = 256


def _q(text: str, schema: sql.Identifier) -> sql.Composed:
    """``text`` with every ``{s}`` replaced by the quoted schema name."""
    return sql.SQL(text).format(s=schema)


def _check_schema(schema: str) -> sql.Identifier:
    if not schema or len(schema.encode()) > 63 or "\x00" in schema:
        raise ProtocolUsageError(f"invalid PostgreSQL schema name {schema!r} (1-63 bytes)")
    return sql.Identifier(schema)


def _preamble(name: str) -> list[tuple[sql.SQL | sql.Composed, tuple[Any, ...]]]:
    """The statements that start a migration transaction: lock, create the schema and versions.

    The advisory lock (the key ``planning``'s store takes too) is held until the transaction
    ends, so processes opening stores on one schema at once create and migrate it one at a time.
    """
    schema = sql.Identifier(name)
    return [
        (
            sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"),
            (f"stratagem.schema:{name}",),
        ),
        (_q("CREATE SCHEMA IF NOT EXISTS {s}", schema), ()),
        (
            _q(
                "CREATE TABLE IF NOT EXISTS {s}.schema_versions "
                "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
                schema,
            ),
            (),
        ),
    ]


def _version_query(schema: sql.Identifier) -> sql.Composed:
    return _q("SELECT version FROM {s}.schema_versions WHERE component = %s", schema)


def _set_version(schema: sql.Identifier) -> sql.Composed:
    return _q("INSERT INTO {s}.schema_versions (component, version) VALUES (%s, %s)", schema)


def _schema_mismatch(what: str, location: str, found: int, known: int) -> ProtocolUsageError:
    return ProtocolUsageError(
        f"{what} {location} has schema version {found}; this build reads version {known}"
    )


def _location(url: str, schema: str) -> str:
    """The server, database and schema, without a password: for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return f"postgresql (schema {schema})"
    user = params.get("user")
    who = f"{user}@" if user else ""
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"postgresql://{who}{host}:{port}/{params.get('dbname') or ''} (schema {schema})"


# --- answers --------------------------------------------------------------------------------------


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
        self._ident = _check_schema(schema)
        self.schema = schema
        self.location = _location(url, schema)
        self._url = url
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._max_size = max_size
        self._timeout_s = timeout_s
        self._puts = 0
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None
        self._opening = asyncio.Lock()
        self._closed = False

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
            ProtocolUsageError: When the schema holds answers of another schema version.
            psycopg.Error: When the server cannot be reached.
        """
        await self._connections()

    async def __aenter__(self) -> PostgresAnswerStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _connections(self) -> AsyncConnectionPool[AsyncConnection]:
        if self._closed:
            raise ProtocolUsageError(f"the answer store {self.location} is closed")
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
                self._url,
                min_size=1,
                max_size=self._max_size,
                timeout=self._timeout_s,
                kwargs={"autocommit": True},
                check=AsyncConnectionPool.check_connection,
                name=f"stratagem-answers-{self.schema}",
                open=False,
            )
            try:
                await pool.open(wait=True, timeout=self._timeout_s)
                async with pool.connection() as conn:
                    await self._migrate(conn)
                    await self._prune(conn)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            return pool

    async def _migrate(self, conn: AsyncConnection) -> None:
        schema = self._ident
        async with conn.transaction():
            for statement, params in _preamble(self.schema):
                await conn.execute(statement, params)
            row = await (await conn.execute(_version_query(schema), ("answers",))).fetchone()
            if row is not None and row[0] != ANSWERS_VERSION:
                raise _schema_mismatch("answer store", self.location, row[0], ANSWERS_VERSION)
            if row is None:
                await conn.execute(
                    _q(
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
                    _q(
                        "CREATE INDEX IF NOT EXISTS answers_by_age ON {s}.answers (stored_at)",
                        schema,
                    )
                )
                await conn.execute(_set_version(schema), ("answers", ANSWERS_VERSION))

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``)."""
        horizon = self._clock() - self._retention.max_age_s
        pool = await self._connections()
        async with pool.connection() as conn:
            cursor = await conn.execute(
                _q(
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
        pool = await self._connections()
        async with pool.connection() as conn:
            await conn.execute(
                _q(
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
        pool = await self._connections()
        async with pool.connection() as conn:
            return await self._prune(conn)

    async def count(self) -> int:
        """How many answers are stored."""
        pool = await self._connections()
        async with pool.connection() as conn:
            cursor = await conn.execute(_q("SELECT count(*) FROM {s}.answers", self._ident))
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def _prune(self, conn: AsyncConnection) -> int:
        retention = self._retention
        horizon = self._clock() - retention.max_age_s
        # Newest first: an answer goes when it is expired, or when it and the newer ones exceed
        # the count or the bytes kept.
        cursor = await conn.execute(
            _q(
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
        if self._closed:
            return
        self._closed = True
        async with self._opening:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


# --- audit ----------------------------------------------------------------------------------------

_AUDIT_SCHEMA: Final = (
    """CREATE TABLE {s}.audit (
        seq BIGINT PRIMARY KEY,
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
    "CREATE TABLE {s}.audit_lock (id SMALLINT PRIMARY KEY CHECK (id = 1))",
    "INSERT INTO {s}.audit_lock (id) VALUES (1)",
    # Append-only for this code and anyone using the table by mistake; a deliberate tamperer can
    # drop the triggers, which the hash chain then exposes.
    """CREATE FUNCTION {s}.audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$""",
    """CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON {s}.audit
        FOR EACH ROW EXECUTE FUNCTION {s}.audit_append_only()""",
    """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON {s}.audit
        FOR EACH STATEMENT EXECUTE FUNCTION {s}.audit_append_only()""",
)


class PostgresAuditLog(_GroupCommitLog):
    """An audit log in a PostgreSQL schema, one chain for every writer of every process and node.

    ``append``, ``records`` and ``head`` block (call them from a thread in async code);
    ``append_async`` does not.

    Args:
        url: A libpq connection string or URL.
        schema: The PostgreSQL schema of the deployment's audit log.
        max_size: The most connections the pool opens.
        timeout_s: How long a call waits for a connection (and the constructor for the server).

    Raises:
        ProtocolUsageError: When the schema holds an audit log of another schema version.
        psycopg.Error: When the server cannot be reached.
    """

    _PAGE = 1000

    def __init__(
        self, url: str, *, schema: str = "stratagem", max_size: int = 4, timeout_s: float = 30.0
    ) -> None:
        self._ident = _check_schema(schema)
        self.schema = schema
        self.location = _location(url, schema)
        self._start_queue(self.location)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            timeout=timeout_s,
            kwargs={"autocommit": True},
            check=ConnectionPool.check_connection,
            name=f"stratagem-audit-{schema}",
            open=False,
        )
        self._insert = _q(
            f"INSERT INTO {{s}}.audit ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join(['%s'] * len(_COLUMNS))})",
            self._ident,
        )
        self._last = _q("SELECT seq, hash FROM {s}.audit ORDER BY seq DESC LIMIT 1", self._ident)
        try:
            self._pool.open(wait=True, timeout=timeout_s)
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        if self._closed and threading.current_thread() is not self._writer:
            raise ProtocolUsageError(f"the audit log {self.location} is closed")
        with self._pool.connection() as conn:
            yield conn

    def _migrate(self) -> None:
        with self._connection() as conn, conn.transaction():
            for statement, params in _preamble(self.schema):
                conn.execute(statement, params)
            row = conn.execute(_version_query(self._ident), ("audit",)).fetchone()
            if row is not None and row[0] != AUDIT_VERSION:
                raise _schema_mismatch("audit log", self.location, row[0], AUDIT_VERSION)
            if row is None:
                for text in _AUDIT_SCHEMA:
                    conn.execute(_q(text, self._ident))
                conn.execute(_set_version(self._ident), ("audit", AUDIT_VERSION))

    def _commit_many(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        """Chain and write ``entries`` in one transaction, in order, after every earlier writer."""
        with self._connection() as conn, conn.transaction():
            # The row lock orders appenders across connections, processes and nodes; the read
            # below runs after it is granted, so it sees the last record committed before.
            conn.execute(_q("SELECT id FROM {s}.audit_lock FOR UPDATE", self._ident))
            last = conn.execute(self._last).fetchone()
            records = _chain(entries, (int(last[0]), str(last[1])) if last else None)
            with conn.cursor() as cursor:
                cursor.executemany(
                    self._insert,
                    [tuple(getattr(record, name) for name in _COLUMNS) for record in records],
                )
        return records

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order, read a page at a time."""
        after = 0
        page = _q(
            f"SELECT {', '.join(_COLUMNS)} FROM {{s}}.audit WHERE seq > %s ORDER BY seq LIMIT %s",
            self._ident,
        )
        while True:
            with self._connection() as conn:
                rows = conn.execute(page, (after, self._PAGE)).fetchall()
            for row in rows:
                yield AuditRecord(*row)
            if len(rows) < self._PAGE:
                return
            after = int(rows[-1][0])

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with self._connection() as conn:
            row = conn.execute(self._last).fetchone()
        return str(row[1]) if row else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        query = _q(
            f"SELECT {', '.join(_COLUMNS)} FROM {{s}}.audit ORDER BY seq DESC LIMIT 1", self._ident
        )
        with self._connection() as conn:
            row = conn.execute(query).fetchone()
        return AuditRecord(*row) if row else None

    def remove_through(self, seq: int) -> int:
        """Delete the records up to ``seq`` (kept elsewhere: ``protocol._audit_archive``); the
        last record always stays, so the chain goes on from it. Returns how many were deleted.

        The append-only trigger is disabled for this one transaction, under the appenders' lock
        (the table's owner may do that; so may a tamperer who owns it, which the chain exposes).
        """
        with self._connection() as conn, conn.transaction():
            conn.execute(_q("SELECT id FROM {s}.audit_lock FOR UPDATE", self._ident))
            last = conn.execute(self._last).fetchone()
            if last is None:
                return 0
            through = min(seq, int(last[0]) - 1)
            conn.execute(_q("ALTER TABLE {s}.audit DISABLE TRIGGER audit_no_change", self._ident))
            cursor = conn.execute(
                _q("DELETE FROM {s}.audit WHERE seq <= %s", self._ident), (through,)
            )
            conn.execute(_q("ALTER TABLE {s}.audit ENABLE TRIGGER audit_no_change", self._ident))
            return max(cursor.rowcount, 0)

    def close(self) -> None:
        """Write the records already handed to ``append_async``, then close the pool."""
        with self._lock:
            closed, self._closed = self._closed, True
        if closed:
            return
        self._stop_writer()
        self._pool.close()

    def __enter__(self) -> PostgresAuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PostgresAuditHeads:
    """The audit chain's signed heads in a table beside the log (``audit_heads`` in the log's
    schema), so ``stratagem audit verify`` on any node checks every seal, wherever it was made.

    A ``HeadsStore``: append-only (triggers refuse UPDATE, DELETE and TRUNCATE, as on ``audit``).
    Each call opens a short connection: heads are written every few seconds at most.

    Args:
        url: A libpq connection string or URL.
        schema: The audit log's PostgreSQL schema.
        timeout_s: How long to wait for the server.
    """

    def __init__(self, url: str, *, schema: str = "stratagem", timeout_s: float = 30.0) -> None:
        self._ident = _check_schema(schema)
        self._url = url
        self._timeout_s = timeout_s
        self.where = f"{_location(url, schema)} table audit_heads"
        self._ready = False

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with psycopg.connect(self._url, connect_timeout=max(1, int(self._timeout_s))) as conn:
            if not self._ready:
                self._create(conn)
            yield conn

    def _create(self, conn: Connection) -> None:
        s = self._ident
        with conn.transaction():
            # Agents on several nodes may create it at once: one at a time.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('stratagem.audit_heads'))")
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=s))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {s}.audit_heads "
                    "(id BIGSERIAL PRIMARY KEY, line BYTEA NOT NULL)"
                ).format(s=s)
            )
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE FUNCTION {s}.audit_heads_append_only() RETURNS trigger "
                    "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
                    "'audit_heads is append-only'; END $$"
                ).format(s=s)
            )
            for name, when in (
                (
                    "audit_heads_no_change",
                    "BEFORE UPDATE OR DELETE ON {s}.audit_heads FOR EACH ROW",
                ),
                (
                    "audit_heads_no_truncate",
                    "BEFORE TRUNCATE ON {s}.audit_heads FOR EACH STATEMENT",
                ),
            ):
                conn.execute(
                    sql.SQL("DROP TRIGGER IF EXISTS {name} ON {s}.audit_heads").format(
                        name=sql.Identifier(name), s=s
                    )
                )
                conn.execute(
                    sql.SQL(
                        "CREATE TRIGGER {name} "
                        + when
                        + " EXECUTE FUNCTION {s}.audit_heads_append_only()"
                    ).format(name=sql.Identifier(name), s=s)
                )
        self._ready = True

    def append(self, line: bytes) -> None:
        """Insert one signed-head line."""
        with self._connect() as conn, conn.transaction():
            conn.execute(
                sql.SQL("INSERT INTO {s}.audit_heads (line) VALUES (%s)").format(s=self._ident),
                (line,),
            )

    def read(self) -> bytes | None:
        """Every line in the order inserted; ``None`` when the table holds none."""
        with self._connect() as conn:
            rows = conn.execute(
                sql.SQL("SELECT line FROM {s}.audit_heads ORDER BY id").format(s=self._ident)
            ).fetchall()
        return b"".join(bytes(row[0]) for row in rows) if rows else None

    def tail(self) -> bytes:
        """The last 32 lines."""
        with self._connect() as conn:
            rows = conn.execute(
                sql.SQL("SELECT line FROM {s}.audit_heads ORDER BY id DESC LIMIT 32").format(
                    s=self._ident
                )
            ).fetchall()
        return b"".join(bytes(row[0]) for row in reversed(rows))
