"""The artifact records in a SQLite file (the embedded default): ``SqliteArtifactIndex``.

One table, ``artifacts``, keyed by scope, scope id, name and version, with the digest indexed (the
sweep and ``with_digest`` read it); the provenance is a JSON column. Table ``artifact_bytes``
keeps small artifacts' bytes by digest, written in the transaction that adds their record.
``add`` runs in one ``BEGIN IMMEDIATE`` transaction, so two processes saving the same name get
two versions, and a save repeated after a crash finds the version the first one committed.
Component ``artifacts`` in the shared migration runner.
"""

from __future__ import annotations

import builtins
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import replace
from os import PathLike
from pathlib import Path
from typing import Any, Final

from stratagem.planning._artifacts._index import newest_only, same_save
from stratagem.planning._artifacts._rows import COLUMNS, record_of, row_of
from stratagem.planning._artifacts._types import ArtifactRecord, ArtifactScope
from stratagem.planning._errors import STORE_ERRORS
from stratagem.protocol._storage._sqlite import connect, migrate_file, storage_error, transaction

__all__ = ["MIGRATIONS", "SqliteArtifactIndex"]


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS artifacts ("
        " scope TEXT NOT NULL, scope_id TEXT NOT NULL, name TEXT NOT NULL,"
        " version INTEGER NOT NULL, media_type TEXT NOT NULL, size INTEGER NOT NULL,"
        " digest TEXT NOT NULL, created_at REAL NOT NULL, provenance TEXT NOT NULL,"
        " PRIMARY KEY (scope, scope_id, name, version))"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS artifacts_digest ON artifacts (digest)")


def _migrate_v2(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS artifact_bytes ("
        " digest TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID"
    )


MIGRATIONS: Final = [_migrate_v1, _migrate_v2]


class SqliteArtifactIndex:
    """Artifact records in a SQLite file (WAL), shared by the processes of a node.

    Args:
        path: The database file (created with its folder when missing).
        busy_timeout_s: How long a write waits for another process's lock.
    """

    def __init__(self, path: str | PathLike[str], *, busy_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return str(self.path)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = connect(self.path, timeout_s=self._busy_timeout_s, errors=STORE_ERRORS)
            try:
                migrate_file(
                    conn,
                    "artifacts",
                    MIGRATIONS,
                    location=str(self.path),
                    what="artifact index",
                    errors=STORE_ERRORS,
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _select(self, where: str, args: tuple[Any, ...]) -> builtins.list[ArtifactRecord]:
        with self._lock:
            try:
                rows = (
                    self._connection()
                    .execute(
                        f"SELECT {COLUMNS} FROM artifacts {where} "
                        "ORDER BY scope, scope_id, name, version",
                        args,
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                raise storage_error("read artifacts", self.location, exc, STORE_ERRORS) from exc
        return [record_of(r) for r in rows]

    def add(self, record: ArtifactRecord, data: bytes | None = None) -> tuple[ArtifactRecord, bool]:
        with self._lock:
            conn = self._connection()
            try:
                with transaction(conn):
                    # Only the versions ``same_save`` can answer (those with these bytes) and
                    # the newest: a name saved a thousand times does not decode a thousand rows
                    # on each save.
                    key = (record.scope, record.scope_id, record.name)
                    rows = conn.execute(
                        f"SELECT {COLUMNS} FROM artifacts WHERE scope = ? AND scope_id = ?"
                        " AND name = ? AND (digest = ? OR version = (SELECT max(version)"
                        " FROM artifacts WHERE scope = ? AND scope_id = ? AND name = ?))"
                        " ORDER BY version",
                        (*key, record.digest, *key),
                    ).fetchall()
                    versions = [record_of(r) for r in rows]
                    old = same_save(versions, record)
                    if old is not None:
                        return old, False
                    stored = replace(record, version=versions[-1].version + 1 if versions else 1)
                    conn.execute(
                        f"INSERT INTO artifacts ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        row_of(stored),
                    )
                    if data is not None:
                        conn.execute(
                            "INSERT OR IGNORE INTO artifact_bytes (digest, data) VALUES (?, ?)",
                            (record.digest, data),
                        )
            except sqlite3.Error as exc:
                raise storage_error("save an artifact", self.location, exc, STORE_ERRORS) from exc
        return stored, True

    def kept(self, digest: str) -> bytes | None:
        with self._lock:
            try:
                row = (
                    self._connection()
                    .execute("SELECT data FROM artifact_bytes WHERE digest = ?", (digest,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise storage_error("read an artifact", self.location, exc, STORE_ERRORS) from exc
        return None if row is None else bytes(row[0])

    def get(
        self, scope: ArtifactScope, scope_id: str, name: str, version: int | None
    ) -> ArtifactRecord | None:
        if version is None:
            found = self._select(
                "WHERE scope = ? AND scope_id = ? AND name = ? AND version = (SELECT max(version)"
                " FROM artifacts WHERE scope = ? AND scope_id = ? AND name = ?)",
                (scope, scope_id, name, scope, scope_id, name),
            )
        else:
            found = self._select(
                "WHERE scope = ? AND scope_id = ? AND name = ? AND version = ?",
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
                clauses.append(f"{column} = ?")
                args.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        found = self._select(where, tuple(args))
        return newest_only(found) if latest else found

    def with_digest(self, digest: str) -> builtins.list[ArtifactRecord]:
        return self._select("WHERE digest = ?", (digest,))

    def remove(self, records: Iterable[ArtifactRecord]) -> int:
        keys = [(r.scope, r.scope_id, r.name, r.version) for r in records]
        removed = 0
        with self._lock:
            conn = self._connection()
            try:
                with transaction(conn):
                    for key in keys:
                        removed += conn.execute(
                            "DELETE FROM artifacts WHERE scope = ? AND scope_id = ? AND name = ?"
                            " AND version = ?",
                            key,
                        ).rowcount
                    if removed:
                        conn.execute(
                            "DELETE FROM artifact_bytes WHERE digest NOT IN"
                            " (SELECT digest FROM artifacts)"
                        )
            except sqlite3.Error as exc:
                raise storage_error("remove artifacts", self.location, exc, STORE_ERRORS) from exc
        return removed

    def digests(self) -> set[str]:
        with self._lock:
            try:
                rows = self._connection().execute("SELECT DISTINCT digest FROM artifacts")
                return {r[0] for r in rows}
            except sqlite3.Error as exc:
                raise storage_error("read artifacts", self.location, exc, STORE_ERRORS) from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
