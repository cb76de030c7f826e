"""The artifact records in PostgreSQL, for clusters: ``PostgresArtifactIndex``.

The records of every agent of a deployment live in one schema (``stratagem_artifacts`` by default),
table ``artifacts`` (the SQLite layout: one row format, ``_rows``; small artifacts' bytes in
``artifact_bytes``), so an agent Ray moves to
another node, the CLI and the console read the same records. ``add`` takes a transaction-scoped
advisory lock on the artifact's scope, scope id and name before it reads the versions, so two
savers never assign one version twice. Component ``artifacts`` of the schema's
``schema_versions``. Requires the ``postgres`` extra (imported on first use).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql

from stratagem.planning._artifacts._index import newest_only, same_save
from stratagem.planning._artifacts._rows import COLUMNS, record_of, row_of
from stratagem.planning._artifacts._types import ArtifactRecord, ArtifactScope
from stratagem.planning._errors import STORE_ERRORS
from stratagem.protocol._storage._postgres import (
    Connection,
    connect_blocking,
    describe,
    migrate_blocking,
    q,
    schema_identifier,
    translated,
)

__all__ = ["DEFAULT_SCHEMA", "MIGRATIONS", "PostgresArtifactIndex"]

T = TypeVar("T")

DEFAULT_SCHEMA: Final = "stratagem_artifacts"


def _migrate_v1(conn: Connection, schema: sql.Identifier) -> None:
    conn.execute(
        q(
            "CREATE TABLE IF NOT EXISTS {s}.artifacts ("
            " scope TEXT NOT NULL, scope_id TEXT NOT NULL, name TEXT NOT NULL,"
            " version INTEGER NOT NULL, media_type TEXT NOT NULL, size BIGINT NOT NULL,"
            " digest TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
            " provenance TEXT NOT NULL, PRIMARY KEY (scope, scope_id, name, version))",
            schema,
        )
    )
    conn.execute(q("CREATE INDEX IF NOT EXISTS artifacts_digest ON {s}.artifacts (digest)", schema))


def _migrate_v2(conn: Connection, schema: sql.Identifier) -> None:
    conn.execute(
        q(
            "CREATE TABLE IF NOT EXISTS {s}.artifact_bytes ("
            " digest TEXT PRIMARY KEY, data BYTEA NOT NULL)",
            schema,
        )
    )


MIGRATIONS: Final = [_migrate_v1, _migrate_v2]
"""The artifact table's migrations, oldest first (component ``artifacts``)."""

_ORDER: Final = " ORDER BY scope, scope_id, name, version"


class PostgresArtifactIndex:
    """Artifact records in ``<schema>.artifacts``.

    Args:
        url: A libpq connection string or URL.
        schema: The schema (created when missing).
        timeout_s: How long connecting may take.
    """

    def __init__(self, url: str, *, schema: str = DEFAULT_SCHEMA, timeout_s: float = 30.0) -> None:
        self._url = url
        self._schema_name = schema
        self._schema = schema_identifier(schema)
        self._location = describe(url, schema)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    @property
    def location(self) -> str:
        return self._location

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            conn = connect_blocking(self._url, timeout_s=self._timeout_s)
            try:
                migrate_blocking(
                    conn,
                    self._schema_name,
                    "artifacts",
                    MIGRATIONS,
                    location=self._location,
                    what="artifact index",
                    errors=STORE_ERRORS,
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _with(self, action: str, body: Callable[[Connection], T]) -> T:
        """``body`` on the connection, reconnecting once when the connection was lost."""
        with self._lock, translated(action, self._location, STORE_ERRORS):
            try:
                return body(self._connection())
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                return body(self._connection())

    def _select(self, where: str, args: tuple[Any, ...]) -> builtins.list[ArtifactRecord]:
        statement = q(f"SELECT {COLUMNS} FROM {{s}}.artifacts {where}{_ORDER}", self._schema)
        rows = self._with("read artifacts", lambda c: c.execute(statement, args).fetchall())
        return [record_of(r) for r in rows]

    def add(self, record: ArtifactRecord, data: bytes | None = None) -> tuple[ArtifactRecord, bool]:
        def body(conn: Connection) -> tuple[ArtifactRecord, bool]:
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"artifact:{record.scope}/{record.scope_id}/{record.name}",),
                )
                # Only the versions ``same_save`` can answer and the newest (as in SQLite).
                key = (record.scope, record.scope_id, record.name)
                rows = conn.execute(
                    q(
                        f"SELECT {COLUMNS} FROM {{s}}.artifacts WHERE scope = %s"
                        " AND scope_id = %s AND name = %s AND (digest = %s OR version ="
                        " (SELECT max(version) FROM {s}.artifacts WHERE scope = %s"
                        " AND scope_id = %s AND name = %s)) ORDER BY version",
                        self._schema,
                    ),
                    (*key, record.digest, *key),
                ).fetchall()
                versions = [record_of(r) for r in rows]
                old = same_save(versions, record)
                if old is not None:
                    return old, False
                stored = replace(record, version=versions[-1].version + 1 if versions else 1)
                conn.execute(
                    q(
                        f"INSERT INTO {{s}}.artifacts ({COLUMNS}) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        self._schema,
                    ),
                    row_of(stored),
                )
                if data is not None:
                    conn.execute(
                        q(
                            "INSERT INTO {s}.artifact_bytes (digest, data) VALUES (%s, %s)"
                            " ON CONFLICT (digest) DO NOTHING",
                            self._schema,
                        ),
                        (record.digest, data),
                    )
                return stored, True

        return self._with("save an artifact", body)

    def kept(self, digest: str) -> bytes | None:
        statement = q("SELECT data FROM {s}.artifact_bytes WHERE digest = %s", self._schema)
        row = self._with("read an artifact", lambda c: c.execute(statement, (digest,)).fetchone())
        return None if row is None else bytes(row[0])

    def get(
        self, scope: ArtifactScope, scope_id: str, name: str, version: int | None
    ) -> ArtifactRecord | None:
        if version is None:
            found = self._select(
                "WHERE scope = %s AND scope_id = %s AND name = %s AND version = (SELECT"
                " max(version) FROM {s}.artifacts WHERE scope = %s AND scope_id = %s"
                " AND name = %s)",
                (scope, scope_id, name, scope, scope_id, name),
            )
        else:
            found = self._select(
                "WHERE scope = %s AND scope_id = %s AND name = %s AND version = %s",
                (scope, scope_id, name, version),
            )
        return found[0] if found else None

    def list(
        self,
        *,
        scope: ArtifactScope | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        latest: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        clauses: builtins.list[str] = []
        args: builtins.list[Any] = []
        for column, value in (("scope", scope), ("scope_id", scope_id), ("name", name)):
            if value is not None:
                clauses.append(f"{column} = %s")
                args.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        found = self._select(where, tuple(args))
        return newest_only(found) if latest else found

    def with_digest(self, digest: str) -> builtins.list[ArtifactRecord]:
        return self._select("WHERE digest = %s", (digest,))

    def remove(self, records: Iterable[ArtifactRecord]) -> int:
        keys = [(r.scope, r.scope_id, r.name, r.version) for r in records]

        def body(conn: Connection) -> int:
            removed = 0
            with conn.transaction():
                for key in keys:
                    removed += conn.execute(
                        q(
                            "DELETE FROM {s}.artifacts WHERE scope = %s AND scope_id = %s"
                            " AND name = %s AND version = %s",
                            self._schema,
                        ),
                        key,
                    ).rowcount
                if removed:
                    # Kept bytes go once no record names them. The lock waits for every save
                    # writing kept bytes to commit (and holds new ones back): a save of the same
                    # bytes committing meanwhile is seen, and its bytes stay.
                    conn.execute(
                        q("LOCK TABLE {s}.artifact_bytes IN SHARE ROW EXCLUSIVE MODE", self._schema)
                    )
                    conn.execute(
                        q(
                            "DELETE FROM {s}.artifact_bytes WHERE digest NOT IN"
                            " (SELECT digest FROM {s}.artifacts)",
                            self._schema,
                        )
                    )
            return removed

        return self._with("remove artifacts", body)

    def digests(self) -> set[str]:
        statement = q("SELECT DISTINCT digest FROM {s}.artifacts", self._schema)
        rows = self._with("read artifacts", lambda c: c.execute(statement).fetchall())
        return {str(r[0]) for r in rows}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
