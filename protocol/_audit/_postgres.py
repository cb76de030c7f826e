"""The audit log and its signed heads on a PostgreSQL server (psycopg 3, a connection pool).

``PostgresAuditLog`` keeps what ``SqliteAuditLog`` keeps, with the same semantics, on a server
every node of a cluster reaches: an agent that restarts on another node finds the audit chain
where it left it. The log is one chain for the whole deployment, like the one SQLite file it
replaces: every agent appends to the same schema (``"stratagem"`` by default).
``PostgresAuditHeads`` keeps the chain's signed heads in a table beside it.

Schema (``schema_versions`` has one row per component)::

    schema_versions(component, version)     'audit' (version 1), 'audit_heads' (version 1)
    audit(seq, ts, actor, action, target, capability, request_id, code, detail, digest,
          prev_hash, hash)                  append-only: triggers refuse UPDATE, DELETE, TRUNCATE
    audit_lock(id)                          one row; appenders lock it (``SELECT ... FOR UPDATE``)
    audit_heads(id, line)                   the signed heads, append-only like ``audit``

Concurrent audit writers: every transaction that appends first locks the one ``audit_lock`` row,
then reads the last record and writes its own after it. Writers in other threads, processes or
nodes wait for that row lock, and under ``READ COMMITTED`` the read that follows it sees every
record committed before, so the chain never forks (the primary key on ``seq`` would refuse a fork
anyway). ``append_async`` hands records to the log's writer thread, which commits everything queued
meanwhile in one transaction (group commit, ``_group``), like ``SqliteAuditLog``.

Durability: a commit that returned is on the server's disk under PostgreSQL's default
``synchronous_commit=on``, so a record survives a crash of the agent, of its node and of the
server. The pool, the migrations (``MIGRATIONS``, ``HEADS_MIGRATIONS``: the shared runner, under
the schema's lock) and the translation of ``psycopg`` errors into ``StorageError`` are the shared
PostgreSQL seam's (``protocol._storage._postgres``); calls after closing raise
``ProtocolUsageError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Final

from psycopg import sql

from stratagem.protocol._audit._group import _GroupCommitLog
from stratagem.protocol._audit._log import _COLUMNS, GENESIS, AuditRecord, _chain, _Entry
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage._postgres import (
    DATABASE_ERRORS,
    Connection,
    blocking_pool,
    connect_blocking,
    describe,
    migrate_blocking,
    opening_error,
    q,
    schema_identifier,
    translated,
)

__all__ = ["HEADS_MIGRATIONS", "MIGRATIONS", "PostgresAuditHeads", "PostgresAuditLog"]

logger = logging.getLogger(__name__)


def _migrate_audit_v1(conn: Connection, schema: sql.Identifier) -> None:
    for statement in (
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
        # Append-only for this code and anyone using the table by mistake; a deliberate tamperer
        # can drop the triggers, which the hash chain then exposes.
        """CREATE FUNCTION {s}.audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$""",
        """CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON {s}.audit
            FOR EACH ROW EXECUTE FUNCTION {s}.audit_append_only()""",
        """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON {s}.audit
            FOR EACH STATEMENT EXECUTE FUNCTION {s}.audit_append_only()""",
    ):
        conn.execute(q(statement, schema))


MIGRATIONS: Final = [_migrate_audit_v1]
"""The audit log's migrations, oldest first (component ``audit``)."""


def _migrate_heads_v1(conn: Connection, s: sql.Identifier) -> None:
    # Idempotent: schemas made before the heads had a version row hold the table already.
    conn.execute(
        q(
            "CREATE TABLE IF NOT EXISTS {s}.audit_heads "
            "(id BIGSERIAL PRIMARY KEY, line BYTEA NOT NULL)",
            s,
        )
    )
    conn.execute(
        q(
            "CREATE OR REPLACE FUNCTION {s}.audit_heads_append_only() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'audit_heads is append-only'; END $$",
            s,
        )
    )
    for name, when in (
        ("audit_heads_no_change", "BEFORE UPDATE OR DELETE ON {s}.audit_heads FOR EACH ROW"),
        ("audit_heads_no_truncate", "BEFORE TRUNCATE ON {s}.audit_heads FOR EACH STATEMENT"),
    ):
        trigger = sql.Identifier(name)
        conn.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {name} ON {s}.audit_heads").format(name=trigger, s=s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {name} " + when + " EXECUTE FUNCTION {s}.audit_heads_append_only()"
            ).format(name=trigger, s=s)
        )


HEADS_MIGRATIONS: Final = [_migrate_heads_v1]
"""The signed heads' migrations, oldest first (component ``audit_heads``)."""


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
        StorageSchemaError: When the schema holds an audit log of a newer schema version (a
            ``ProtocolUsageError`` too).
        StorageError: When the server cannot be reached.
    """

    _PAGE = 1000

    def __init__(
        self, url: str, *, schema: str = "stratagem", max_size: int = 4, timeout_s: float = 30.0
    ) -> None:
        self._ident = schema_identifier(schema)
        self.schema = schema
        self.location = describe(url, schema)
        self._start_queue(self.location)
        self._insert = q(
            f"INSERT INTO {{s}}.audit ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join(['%s'] * len(_COLUMNS))})",
            self._ident,
        )
        self._last = q("SELECT seq, hash FROM {s}.audit ORDER BY seq DESC LIMIT 1", self._ident)
        try:
            self._pool = blocking_pool(
                url, name=f"stratagem-audit-{schema}", max_size=max_size, timeout_s=timeout_s
            )
        except DATABASE_ERRORS as exc:
            raise opening_error("audit log", self.location, exc) from exc
        try:
            with self._connection() as conn:
                migrate_blocking(
                    conn, schema, "audit", MIGRATIONS, location=self.location, what="audit log"
                )
        except DATABASE_ERRORS as exc:
            self._pool.close()
            raise opening_error("audit log", self.location, exc) from exc
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        if self._closed and not self._worker.is_current():
            raise ProtocolUsageError(f"the audit log {self.location} is closed")
        with self._pool.connection() as conn:
            yield conn

    def _commit_many(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        """Chain and write ``entries`` in one transaction, in order, after every earlier writer."""
        with (
            translated(f"write {len(entries)} audit records", self.location),
            self._connection() as conn,
            conn.transaction(),
        ):
            # The row lock orders appenders across connections, processes and nodes; the read
            # below runs after it is granted, so it sees the last record committed before.
            conn.execute(q("SELECT id FROM {s}.audit_lock FOR UPDATE", self._ident))
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
        page = q(
            f"SELECT {', '.join(_COLUMNS)} FROM {{s}}.audit WHERE seq > %s ORDER BY seq LIMIT %s",
            self._ident,
        )
        while True:
            with translated("read the audit records", self.location), self._connection() as conn:
                rows = conn.execute(page, (after, self._PAGE)).fetchall()
            for row in rows:
                yield AuditRecord(*row)
            if len(rows) < self._PAGE:
                return
            after = int(rows[-1][0])

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with translated("read the audit head", self.location), self._connection() as conn:
            row = conn.execute(self._last).fetchone()
        return str(row[1]) if row else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        query = q(
            f"SELECT {', '.join(_COLUMNS)} FROM {{s}}.audit ORDER BY seq DESC LIMIT 1", self._ident
        )
        with translated("read the last audit record", self.location), self._connection() as conn:
            row = conn.execute(query).fetchone()
        return AuditRecord(*row) if row else None

    def remove_through(self, seq: int) -> int:
        """Delete the records up to ``seq`` (kept elsewhere: ``_archive``); the
        last record always stays, so the chain goes on from it. Returns how many were deleted.

        The append-only trigger is disabled for this one transaction, under the appenders' lock
        (the table's owner may do that; so may a tamperer who owns it, which the chain exposes).
        """
        with (
            translated(f"remove the audit records through {seq}", self.location),
            self._connection() as conn,
            conn.transaction(),
        ):
            conn.execute(q("SELECT id FROM {s}.audit_lock FOR UPDATE", self._ident))
            last = conn.execute(self._last).fetchone()
            if last is None:
                return 0
            through = min(seq, int(last[0]) - 1)
            conn.execute(q("ALTER TABLE {s}.audit DISABLE TRIGGER audit_no_change", self._ident))
            cursor = conn.execute(
                q("DELETE FROM {s}.audit WHERE seq <= %s", self._ident), (through,)
            )
            conn.execute(q("ALTER TABLE {s}.audit ENABLE TRIGGER audit_no_change", self._ident))
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
        self._ident = schema_identifier(schema)
        self._url = url
        self._schema = schema
        self._timeout_s = timeout_s
        self._location = describe(url, schema)
        self.where = f"{self._location} table audit_heads"
        self._ready = False
        self._lock = threading.Lock()

    @contextmanager
    def _connect(self, action: str) -> Iterator[Connection]:
        with (
            translated(action, self.where),
            connect_blocking(self._url, timeout_s=self._timeout_s) as conn,
        ):
            if not self._ready:
                with self._lock:
                    migrate_blocking(
                        conn,
                        self._schema,
                        "audit_heads",
                        HEADS_MIGRATIONS,
                        location=self.where,
                        what="audit heads",
                    )
                    self._ready = True
            yield conn

    def append(self, line: bytes) -> None:
        """Insert one signed-head line."""
        with self._connect("append a signed head") as conn, conn.transaction():
            conn.execute(q("INSERT INTO {s}.audit_heads (line) VALUES (%s)", self._ident), (line,))

    def read(self) -> bytes | None:
        """Every line in the order inserted; ``None`` when the table holds none."""
        with self._connect("read the signed heads") as conn:
            rows = conn.execute(
                q("SELECT line FROM {s}.audit_heads ORDER BY id", self._ident)
            ).fetchall()
        return b"".join(bytes(row[0]) for row in rows) if rows else None

    def tail(self) -> bytes:
        """The last 32 lines."""
        with self._connect("read the last signed heads") as conn:
            rows = conn.execute(
                q("SELECT line FROM {s}.audit_heads ORDER BY id DESC LIMIT 32", self._ident)
            ).fetchall()
        return b"".join(bytes(row[0]) for row in reversed(rows))
