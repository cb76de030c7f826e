"""An agent's world snapshots in PostgreSQL, so an agent Ray moves to another node keeps its worlds.

With ``STRATAGEM_STORE_URL`` every agent's plans and answers live in the database every node
reaches; a world snapshot in a file of the node's state directory would stay behind when Ray
restarts the perception agent elsewhere (a node died, or its placement allows several nodes).
``PostgresWorldStore`` keeps the snapshots in the agent's schema (``stratagem_<role>.worlds``), a
row per named world, replaced in one transaction on every save, so a restarted agent on any node
reads the worlds its predecessor saved before answering.

``save`` blocks until the transaction commits (the perception agent saves before a tool that
changed the world returns, as with the file store). Requires the ``postgres`` extra: ``agents``
exports the class on first use.

Schema (component ``world``, version 2, a row of the schema's ``schema_versions``)::

    worlds(name, version, snapshot, saved_at)  a row per world; version is the snapshot's format

Version 1 kept one world in ``world(id, version, snapshot, saved_at)`` (one row, id 1); version 2
copies it into ``worlds`` as the ``default`` world and drops that table.

The connection, the migrations (``MIGRATIONS``, run by the shared runner under the schema's lock)
and the translation of ``psycopg`` errors into ``StorageError`` are the shared PostgreSQL seam's
(``protocol._storage._postgres``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, Final

import psycopg
from psycopg import sql

from stratagem.protocol import DEFAULT_WORLD
from stratagem.protocol._storage._postgres import (
    Connection,
    connect_blocking,
    describe,
    migrate_blocking,
    q,
    schema_identifier,
    translated,
)

__all__ = ["MIGRATIONS", "PostgresWorldStore"]

_VERSION = 1


def _migrate_v1(conn: Connection, schema: sql.Identifier) -> None:
    # Idempotent: schemas made before the world had a version row hold the table already.
    conn.execute(
        q(
            "CREATE TABLE IF NOT EXISTS {s}.world (id SMALLINT PRIMARY KEY "
            "CHECK (id = 1), version INTEGER NOT NULL, snapshot TEXT NOT NULL, "
            "saved_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            schema,
        )
    )


def _migrate_v2(conn: Connection, schema: sql.Identifier) -> None:
    conn.execute(
        q(
            "CREATE TABLE {s}.worlds (name TEXT PRIMARY KEY, version INTEGER NOT NULL, "
            "snapshot TEXT NOT NULL, saved_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            schema,
        )
    )
    conn.execute(
        q(
            "INSERT INTO {s}.worlds (name, version, snapshot, saved_at) "
            "SELECT 'default', version, snapshot, saved_at FROM {s}.world WHERE id = 1",
            schema,
        )
    )
    conn.execute(q("DROP TABLE {s}.world", schema))


MIGRATIONS: Final = [_migrate_v1, _migrate_v2]
"""The world table's migrations, oldest first (component ``world``)."""


class PostgresWorldStore:
    """``WorldStore`` over the rows of ``<schema>.worlds``.

    Args:
        url: A libpq connection string or URL.
        schema: The agent's schema (created when missing).
        timeout_s: How long connecting may take.

    Raises:
        StorageError: When the server cannot be reached (at the first load or save).
    """

    def __init__(self, url: str, *, schema: str, timeout_s: float = 30.0) -> None:
        self._url = url
        self._schema_name = schema
        self._schema = schema_identifier(schema)
        self.location = describe(url, schema)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            conn = connect_blocking(self._url, timeout_s=self._timeout_s)
            try:
                migrate_blocking(
                    conn,
                    self._schema_name,
                    "world",
                    MIGRATIONS,
                    location=self.location,
                    what="world store",
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _run(
        self, action: str, statement: sql.Composed, params: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement (its rows), reconnecting once when the connection was lost."""
        with self._lock, translated(action, self.location):
            try:
                return self._connection().execute(statement, params).fetchall()
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                return self._connection().execute(statement, params).fetchall()

    def load(self, world: str = DEFAULT_WORLD) -> dict[str, Any] | None:
        """The snapshot of ``world`` saved last, or ``None`` when none was."""
        rows = self._run(
            "read the world",
            q("SELECT version, snapshot FROM {s}.worlds WHERE name = %s", self._schema),
            (world,),
        )
        if not rows:
            return None
        row = rows[0]
        if row[0] != _VERSION:
            raise ValueError(
                f"the world snapshot has version {row[0]}; this build reads {_VERSION}"
            )
        data = json.loads(row[1])
        if not isinstance(data, dict):
            raise ValueError("the world row does not hold a world snapshot")
        return data

    def save(self, snapshot: Mapping[str, Any], world: str = DEFAULT_WORLD) -> None:
        """Replace the snapshot of ``world``; returns once the transaction has committed."""
        self._run(
            "save the world",
            q(
                "INSERT INTO {s}.worlds (name, version, snapshot) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version, "
                "snapshot = EXCLUDED.snapshot, saved_at = now() RETURNING name",
                self._schema,
            ),
            (world, _VERSION, json.dumps(snapshot)),
        )

    def names(self) -> list[str]:
        """Every world saved, by name."""
        rows = self._run(
            "list the worlds", q("SELECT name FROM {s}.worlds ORDER BY name", self._schema)
        )
        return [str(row[0]) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
