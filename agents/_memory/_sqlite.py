"""Memory in a SQLite file: the embedded default (``STATE_DIR/memory.db``), recall by FTS5.

Every call runs on the store's own thread (``StoreWorker``), never on the caller's event loop; each
write is one ``BEGIN IMMEDIATE`` transaction, so a put is all there or not there after a crash, and
several processes (one per agent) share the file.

Schema (component ``memory``, version 1)::

    memory_items(id, namespace, key, value, body, created_at, updated_at, expires_at)
        namespace is its parts joined and ended by "/" ("user/ana/"), so "user/ana/" and every
        namespace below it is one range of the unique index (namespace, key); body is the text
        recall indexes (``searchable_text``)
    memory_fts  FTS5 over body (external content, kept by triggers), porter stemming

Recall ranks by BM25 (``score`` is minus BM25: higher is better) and matches any word of the query
(each word quoted: the query is never FTS5 syntax). Filters compare ``json_type`` and
``json_extract`` of the value at each field path.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any, Final

from stratagem.agents._memory._model import (
    DEFAULT_LIMITS,
    JsonValue,
    MemoryItem,
    MemoryLimits,
    Namespace,
    check_filter,
    check_key,
    check_limit,
    check_namespace,
    check_offset,
    check_query,
    check_ttl,
    encode_value,
    filter_kind,
    searchable_text,
)
from stratagem.agents._memory._store import query_terms
from stratagem.agents._memory._vectors import VECTOR_SCAN_LIMIT, Embedder, pack, rank
from stratagem.protocol import StorageError
from stratagem.protocol._storage import StoreWorker
from stratagem.protocol._storage._sqlite import (
    connect,
    migrate_file,
    storage_error,
    transaction,
)

__all__ = ["MIGRATIONS", "SqliteMemoryStore", "namespace_range"]

_SWEEP_EVERY: Final = 256  # writes between two sweeps of expired items
_SMALL_NAMESPACE: Final = 2000  # items: below it, a newest-first read sorts the namespace


def _migrate_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE memory_items (id INTEGER PRIMARY KEY, namespace TEXT NOT NULL, "
        "key TEXT NOT NULL, value TEXT NOT NULL, body TEXT NOT NULL, "
        "created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL, embedding BLOB, "
        "UNIQUE (namespace, key))"
    )
    conn.execute(
        "CREATE INDEX memory_items_expiry ON memory_items (expires_at) WHERE expires_at IS NOT NULL"
    )
    conn.execute("CREATE INDEX memory_items_recent ON memory_items (updated_at)")
    conn.execute(
        "CREATE VIRTUAL TABLE memory_fts USING fts5(body, content='memory_items', "
        "content_rowid='id', tokenize='porter unicode61')"
    )
    conn.execute(
        "CREATE TRIGGER memory_items_ai AFTER INSERT ON memory_items BEGIN "
        "INSERT INTO memory_fts (rowid, body) VALUES (new.id, new.body); END"
    )
    conn.execute(
        "CREATE TRIGGER memory_items_ad AFTER DELETE ON memory_items BEGIN "
        "INSERT INTO memory_fts (memory_fts, rowid, body) VALUES ('delete', old.id, old.body); "
        "END"
    )
    conn.execute(
        "CREATE TRIGGER memory_items_au AFTER UPDATE ON memory_items BEGIN "
        "INSERT INTO memory_fts (memory_fts, rowid, body) VALUES ('delete', old.id, old.body); "
        "INSERT INTO memory_fts (rowid, body) VALUES (new.id, new.body); END"
    )


MIGRATIONS: Final = [_migrate_v1]
"""The memory file's migrations, oldest first (component ``memory``)."""


def namespace_range(namespace: Namespace) -> tuple[str, str]:
    """The stored namespaces at or below ``namespace``: ``low <= stored < high``."""
    low = "/".join(namespace) + "/"
    return low, low[:-1] + "0"  # "0" follows "/": no part holds a "/"


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


def _newest_first(conn: sqlite3.Connection, low: str, high: str) -> str:
    """How to read a namespace's newest items: a namespace of many items along the index of
    update times (stopping at the first ``limit`` that pass), a small one by its range of the
    namespace index (sorting what it holds), so neither case reads the whole table."""
    (count,) = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM memory_items WHERE namespace >= ? AND namespace < ? "
        "LIMIT ?)",
        (low, high, _SMALL_NAMESPACE),
    ).fetchone()
    return "INDEXED BY memory_items_recent" if count >= _SMALL_NAMESPACE else ""


def _fts_query(terms: list[str]) -> str:
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def filter_sql(filter: Mapping[str, JsonValue], column: str) -> tuple[str, list[Any]]:
    """SQL conditions (each starting `` AND``) that keep the rows whose JSON ``column`` holds
    each field of ``filter``, and their parameters."""
    clauses: list[str] = []
    params: list[Any] = []
    for path, wanted in filter.items():
        where = "$." + ".".join(f'"{part}"' for part in path.split("."))
        kind = filter_kind(wanted)
        if kind == "number":
            clauses.append(
                f" AND json_type({column}, ?) IN ('integer', 'real') "
                f"AND json_extract({column}, ?) = ?"
            )
            params += [where, where, wanted]
        elif kind == "string":
            clauses.append(
                f" AND json_type({column}, ?) = 'text' AND json_extract({column}, ?) = ?"
            )
            params += [where, where, wanted]
        else:
            clauses.append(f" AND json_type({column}, ?) = ?")
            params += [where, kind]
    return "".join(clauses), params


class SqliteMemoryStore:
    """``MemoryStore`` in a SQLite file (created with mode 0600 when missing).

    Args:
        path: The database file (``STATE_DIR/memory.db`` in a deployment).
        limits: What it accepts.
        clock: Seconds since the epoch (tests pass a fake one to expire items).
        timeout_s: How long a write waits for another process's lock.
        embedder: Where vectors come from; with one, ``search`` with a query recalls by cosine
            similarity (``_vectors``), else by full text.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        limits: MemoryLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
        embedder: Embedder | None = None,
    ) -> None:
        self.path = Path(path)
        self.embedder = embedder
        self.location = str(self.path)
        self.limits = limits
        self._clock = clock
        self._timeout_s = timeout_s
        self._worker = StoreWorker(f"memory:{self.path.name}")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._writes = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._worker.call(self._open)

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(
                f"the memory store {self.location} is closed", location=self.location
            )
        if self._conn is None:
            conn = connect(self.path, timeout_s=self._timeout_s)
            try:
                migrate_file(
                    conn, "memory", MIGRATIONS, location=self.location, what="memory store"
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    async def aclose(self) -> None:
        if self._closed:
            return
        await self._worker.call(self._close)
        self._worker.stop()

    def _close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _call(self, action: str, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        def job() -> Any:
            conn = self._open()
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise storage_error(action, self.location, exc) from exc

        return await self._worker.call(job)

    # -- writes ------------------------------------------------------------------------------

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

        def write(conn: sqlite3.Connection) -> MemoryItem:
            now = self._clock()
            expires = None if ttl is None else now + ttl
            with transaction(conn):
                # An expired item is gone: its key starts afresh.
                conn.execute(
                    "DELETE FROM memory_items WHERE namespace = ? AND key = ? "
                    "AND expires_at IS NOT NULL AND expires_at <= ?",
                    (stored_ns, key, now),
                )
                row = conn.execute(
                    "INSERT INTO memory_items (namespace, key, value, body, created_at, "
                    "updated_at, expires_at, embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                    "body = excluded.body, updated_at = excluded.updated_at, "
                    "expires_at = excluded.expires_at, embedding = excluded.embedding "
                    "RETURNING namespace, key, value, created_at, updated_at, expires_at",
                    (stored_ns, key, text, body, now, now, expires, vector),
                ).fetchone()
            self._writes += 1
            if self._writes % _SWEEP_EVERY == 0:
                self._sweep(conn)
            return _item(row)

        item: MemoryItem = await self._call("write memory", write)
        return item

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        stored_ns = namespace_range(ns)[0]

        def remove(conn: sqlite3.Connection) -> bool:
            now = self._clock()
            with transaction(conn):
                row = conn.execute(
                    "DELETE FROM memory_items WHERE namespace = ? AND key = ? RETURNING expires_at",
                    (stored_ns, key),
                ).fetchone()
            return row is not None and (row[0] is None or row[0] > now)

        found: bool = await self._call("delete memory", remove)
        return found

    def _sweep(self, conn: sqlite3.Connection) -> int:
        with transaction(conn):
            cursor = conn.execute(
                "DELETE FROM memory_items WHERE expires_at IS NOT NULL AND expires_at <= ?",
                (self._clock(),),
            )
        return cursor.rowcount

    async def sweep(self) -> int:
        removed: int = await self._call("sweep memory", self._sweep)
        return removed

    # -- reads -------------------------------------------------------------------------------

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        stored_ns = namespace_range(ns)[0]

        def read(conn: sqlite3.Connection) -> MemoryItem | None:
            row = conn.execute(
                "SELECT namespace, key, value, created_at, updated_at, expires_at "
                "FROM memory_items WHERE namespace = ? AND key = ? "
                "AND (expires_at IS NULL OR expires_at > ?)",
                (stored_ns, key, self._clock()),
            ).fetchone()
            return None if row is None else _item(row)

        item: MemoryItem | None = await self._call("read memory", read)
        return item

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        ns = check_namespace(namespace, self.limits)
        check_limit(limit, self.limits)
        check_offset(offset)
        low, high = namespace_range(ns)

        def read(conn: sqlite3.Connection) -> list[MemoryItem]:
            rows = conn.execute(
                "SELECT namespace, key, value, created_at, updated_at, expires_at "
                "FROM memory_items WHERE namespace >= ? AND namespace < ? "
                "AND (expires_at IS NULL OR expires_at > ?) "
                "ORDER BY namespace, key LIMIT ? OFFSET ?",
                (low, high, self._clock(), limit, offset),
            ).fetchall()
            return [_item(row) for row in rows]

        items: list[MemoryItem] = await self._call("list memory", read)
        return items

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
        where, params = filter_sql(check_filter(filter), "m.value")
        check_limit(limit, self.limits)
        low, high = namespace_range(ns)
        wanted = None
        if self.embedder is not None and terms:
            wanted = (await self.embedder.embed([query or ""]))[0]

        def read(conn: sqlite3.Connection) -> list[MemoryItem]:
            now = self._clock()
            columns = "m.namespace, m.key, m.value, m.created_at, m.updated_at, m.expires_at"
            live = (
                "m.namespace >= ? AND m.namespace < ? "
                "AND (m.expires_at IS NULL OR m.expires_at > ?)"
            )
            if wanted is not None:
                rows = conn.execute(
                    f"SELECT {columns}, m.embedding FROM memory_items m "
                    f"{_newest_first(conn, low, high)} "
                    f"WHERE {live}{where} AND m.embedding IS NOT NULL "
                    f"ORDER BY m.updated_at DESC LIMIT ?",
                    (low, high, now, *params, VECTOR_SCAN_LIMIT),
                ).fetchall()
                best = rank(wanted, ((row[6], row) for row in rows), limit)
                return [_item(row, score) for score, row in best]
            if terms:
                rows = conn.execute(
                    f"SELECT {columns}, -bm25(memory_fts) AS score FROM memory_fts "
                    f"JOIN memory_items m ON m.id = memory_fts.rowid "
                    f"WHERE memory_fts MATCH ? AND {live}{where} "
                    f"ORDER BY bm25(memory_fts) LIMIT ?",
                    (_fts_query(terms), low, high, now, *params, limit),
                ).fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {columns}, NULL AS score FROM memory_items m "
                    f"{_newest_first(conn, low, high)} "
                    f"WHERE {live}{where} ORDER BY m.updated_at DESC LIMIT ?",
                    (low, high, now, *params, limit),
                ).fetchall()
            return [_item(row, None if row[6] is None else float(row[6])) for row in rows]

        items: list[MemoryItem] = await self._call("search memory", read)
        return items
