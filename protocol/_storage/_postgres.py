"""PostgreSQL for every store kept on a server: pools, connections, schemas, versions, errors.

Needs the ``postgres`` extra (psycopg 3 and psycopg_pool): only the stores' PostgreSQL modules
import this one, and only when a PostgreSQL store is made.

Namespacing: every store works in one PostgreSQL **schema** (created when missing) and writes
``{schema}.table`` in every statement (``q``). A schema holds several components (an agent's
plans, answers and world; the deployment's audit log and its signed heads), each with its own row
in ``schema_versions(component, version)``: the migration runner's ``VersionTable`` here
(``PostgresVersions``, and ``BlockingPostgresVersions`` for the stores whose calls block).
Migrations run in one transaction under a transaction-level advisory lock keyed by the schema, so
processes opening stores on one schema at once migrate it one after the other.

Connections: the async stores (plans, answers) share ``PostgresPool``: a psycopg_pool pool opened
on first use, checked before each use (a restarted server costs one failed connection, not a
broken store), its component migrated when it opens. The blocking ones open a ``blocking_pool``
(the audit log) or short connections (``connect_blocking``: signed heads, the world snapshot).

Errors: ``psycopg.Error`` and ``PoolTimeout`` are translated here (``storage_error``,
``translated``): an unreachable server, a connection lost, a lock not granted or a pool that timed
out are ``unavailable``; data or index corruption is ``corrupt``; the rest plain.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage._errors import PROTOCOL_ERRORS, Kind, StorageError, StorageErrors
from stratagem.protocol._storage._migrations import migrate, run_now

__all__ = [
    "DATABASE_ERRORS",
    "AsyncConnection",
    "BlockingPostgresVersions",
    "Connection",
    "PostgresPool",
    "PostgresVersions",
    "blocking_pool",
    "classify",
    "connect_blocking",
    "describe",
    "migrate_blocking",
    "migrate_schema",
    "opening_error",
    "q",
    "schema_identifier",
    "storage_error",
    "translated",
]

AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]
Connection = psycopg.Connection[tuple[Any, ...]]
AsyncMigration = Callable[[AsyncConnection, sql.Identifier], Awaitable[None]]
"""A migration of an async store: statements on the connection, inside the transaction."""
BlockingMigration = Callable[[Connection, sql.Identifier], None]
"""A migration of a blocking store."""

DATABASE_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, PoolTimeout)
"""What the driver and its pool raise."""


def q(text: str, schema: sql.Identifier) -> sql.Composed:
    """``text`` with every ``{s}`` replaced by the quoted schema name."""
    return sql.SQL(text).format(s=schema)


def schema_identifier(
    name: str, *, error: Callable[[str], Exception] = ProtocolUsageError
) -> sql.Identifier:
    """``name`` as a quoted identifier; ``error(message)`` is raised when it cannot be one."""
    if not name or len(name.encode()) > 63 or "\x00" in name:
        raise error(f"invalid PostgreSQL schema name {name!r} (1-63 bytes)")
    return sql.Identifier(name)


def describe(url: str, schema: str) -> str:
    """Where a store keeps its data, for messages: the server, database and schema, no password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return f"postgresql (schema {schema})"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    user = params.get("user")
    who = f"{user}@" if user else ""
    return f"postgresql://{who}{host}:{port}/{params.get('dbname') or ''} (schema {schema})"


def classify(exc: BaseException) -> Kind:
    """The kind of failure ``exc`` (a ``psycopg.Error`` or ``PoolTimeout``) is."""
    if isinstance(exc, psycopg.errors.DataCorrupted | psycopg.errors.IndexCorrupted):
        return "corrupt"
    if isinstance(exc, PoolTimeout | psycopg.OperationalError):
        return "unavailable"
    return "error"


def storage_error(
    action: str, location: str, exc: BaseException, errors: StorageErrors = PROTOCOL_ERRORS
) -> StorageError:
    """``exc`` as the storage error of its kind: "cannot ACTION in LOCATION: EXC"."""
    return errors.of(classify(exc), f"cannot {action} in {location}: {exc}", location)


def opening_error(
    what: str, location: str, exc: BaseException, errors: StorageErrors = PROTOCOL_ERRORS
) -> StorageError:
    """``exc``, met while opening a store, as the storage error of its kind."""
    return errors.of(classify(exc), f"cannot open the {what} {location}: {exc}", location)


@contextmanager
def translated(
    action: str, location: str, errors: StorageErrors = PROTOCOL_ERRORS
) -> Iterator[None]:
    """The driver's errors raised inside become storage errors (``storage_error``)."""
    try:
        yield
    except DATABASE_ERRORS as exc:
        raise storage_error(action, location, exc, errors) from exc


def _lock_key(schema: str) -> str:
    # The key every store of the schema takes, whichever component it migrates.
    return f"stratagem.schema:{schema}"


_PREPARE: tuple[str, ...] = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    "CREATE TABLE IF NOT EXISTS {s}.schema_versions "
    "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
)
_READ = "SELECT version FROM {s}.schema_versions WHERE component = %s"
_WRITE = (
    "INSERT INTO {s}.schema_versions (component, version) VALUES (%s, %s) "
    "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version"
)
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


class PostgresVersions:
    """The runner's ``VersionTable`` on an async connection: ``schema_versions`` rows."""

    database_errors = DATABASE_ERRORS
    elsewhere = "another schema"

    def __init__(self, conn: AsyncConnection, schema: str, location: str) -> None:
        self.conn = conn
        self.schema = schema
        self.ident = sql.Identifier(schema)
        self.location = location

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.conn.transaction():
            await self.conn.execute(_LOCK, (_lock_key(self.schema),))
            for statement in _PREPARE:
                await self.conn.execute(q(statement, self.ident))
            yield

    async def version(self, component: str) -> int:
        cursor = await self.conn.execute(q(_READ, self.ident), (component,))
        row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def set_version(self, component: str, version: int) -> None:
        await self.conn.execute(q(_WRITE, self.ident), (component, version))

    async def apply(self, migration: AsyncMigration) -> None:
        await migration(self.conn, self.ident)


class BlockingPostgresVersions:
    """``PostgresVersions`` on a blocking connection (its awaits never suspend: ``run_now``)."""

    database_errors = DATABASE_ERRORS
    elsewhere = "another schema"

    def __init__(self, conn: Connection, schema: str, location: str) -> None:
        self.conn = conn
        self.schema = schema
        self.ident = sql.Identifier(schema)
        self.location = location

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.conn.transaction():
            self.conn.execute(_LOCK, (_lock_key(self.schema),))
            for statement in _PREPARE:
                self.conn.execute(q(statement, self.ident))
            yield

    async def version(self, component: str) -> int:
        row = self.conn.execute(q(_READ, self.ident), (component,)).fetchone()
        return 0 if row is None else int(row[0])

    async def set_version(self, component: str, version: int) -> None:
        self.conn.execute(q(_WRITE, self.ident), (component, version))

    async def apply(self, migration: BlockingMigration) -> None:
        migration(self.conn, self.ident)


async def migrate_schema(
    conn: AsyncConnection,
    schema: str,
    component: str,
    migrations: Sequence[AsyncMigration],
    *,
    location: str,
    what: str,
    errors: StorageErrors = PROTOCOL_ERRORS,
) -> int:
    """The runner (``_migrations.migrate``) for ``component`` of ``schema``; its version then."""
    table = PostgresVersions(conn, schema, location)
    return await migrate(table, component, migrations, what=what, errors=errors)


def migrate_blocking(
    conn: Connection,
    schema: str,
    component: str,
    migrations: Sequence[BlockingMigration],
    *,
    location: str,
    what: str,
    errors: StorageErrors = PROTOCOL_ERRORS,
) -> int:
    """``migrate_schema`` on a blocking connection, on this thread."""
    table = BlockingPostgresVersions(conn, schema, location)
    return run_now(migrate(table, component, migrations, what=what, errors=errors))


class PostgresPool:
    """An async store's connections: a pool opened on first use and prepared (migrated) then.

    Args:
        url: A libpq connection string or URL.
        schema: The store's schema.
        what: The store, for messages ("state store").
        name: The pool's name (psycopg_pool logs it).
        prepare: Run once on the first connection, before any call (the migrations).
        closed: The exception a call after ``aclose`` raises.
        min_size: Connections the pool keeps open.
        max_size: The most connections the pool opens.
        timeout_s: How long a call waits for a connection (and the first for the server).
        errors: The classes to raise.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str,
        what: str,
        name: str,
        prepare: Callable[[AsyncConnection], Awaitable[None]],
        closed: Callable[[], Exception],
        min_size: int = 1,
        max_size: int = 4,
        timeout_s: float = 30.0,
        errors: StorageErrors = PROTOCOL_ERRORS,
    ) -> None:
        self.location = describe(url, schema)
        self._url = url
        self._what = what
        self._name = name
        self._prepare = prepare
        self._closed_error = closed
        self._min_size = min_size
        self._max_size = max_size
        self._timeout_s = timeout_s
        self._errors = errors
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def get(self) -> AsyncConnectionPool[AsyncConnection]:
        """The open pool (opened and prepared by the first call).

        Raises:
            StorageError: (``errors``) when the server cannot be reached or the preparation
                failed; ``closed()`` after ``aclose``.
        """
        if self._closed:
            raise self._closed_error()
        pool = self._pool
        if pool is not None:
            return pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            if self._closed:
                raise self._closed_error()
            pool = AsyncConnectionPool(
                self._url,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=self._timeout_s,
                kwargs={"autocommit": True},
                check=AsyncConnectionPool.check_connection,
                name=self._name,
                open=False,
            )
            try:
                await pool.open(wait=True, timeout=self._timeout_s)
                async with pool.connection() as conn:
                    await self._prepare(conn)
            except DATABASE_ERRORS as exc:
                await pool.close()
                raise opening_error(self._what, self.location, exc, self._errors) from exc
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            return pool

    @asynccontextmanager
    async def connection(self, action: str) -> AsyncIterator[AsyncConnection]:
        """A connection of the pool; the driver's errors inside become storage errors."""
        pool = await self.get()
        try:
            async with pool.connection() as conn:
                yield conn
        except DATABASE_ERRORS as exc:
            raise storage_error(action, self.location, exc, self._errors) from exc

    async def aclose(self) -> None:
        """Close the pool; later calls raise ``closed()``."""
        if self._closed:
            return
        self._closed = True
        async with self._opening:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


def blocking_pool(
    url: str, *, name: str, max_size: int, timeout_s: float
) -> ConnectionPool[Connection]:
    """An open pool of blocking connections (autocommit, checked before each use).

    Raises:
        psycopg.Error, PoolTimeout: When the server cannot be reached (translate with
            ``translated``).
    """
    pool: ConnectionPool[Connection] = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        timeout=timeout_s,
        kwargs={"autocommit": True},
        check=ConnectionPool.check_connection,
        name=name,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=timeout_s)
    except BaseException:
        pool.close()
        raise
    return pool


def connect_blocking(url: str, *, timeout_s: float) -> Connection:
    """One blocking connection in autocommit mode.

    Raises:
        psycopg.Error: When the server cannot be reached (translate with ``translated``).
    """
    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout_s)))
