"""The ``MemoryStore`` protocol every memory store implements, and ``InMemoryMemoryStore``.

A store keeps items by ``(namespace, key)``; ``put`` replaces the value of a key that exists
(``created_at`` kept, ``updated_at`` and the expiry renewed). An item whose TTL has passed is never
returned again and is removed by the next ``sweep`` (stores sweep on their own from time to time).

``list`` and ``search`` read a namespace **and every namespace below it**. ``search`` recalls by
text (each word of the query, stemmed, matched against the key and every string or number in the
value; the best matches first), keeps only the items whose value holds each field of ``filter``,
and without a query returns the matching items most recently written first.

Stores: ``InMemoryMemoryStore`` (here, for tests), ``SqliteMemoryStore`` (``_sqlite``: FTS5, the
embedded default), ``PostgresMemoryStore`` (``_postgres``: full text with a GIN index).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Final, Protocol

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
    matches_filter,
    searchable_text,
)
from stratagem.agents._memory._vectors import VECTOR_SCAN_LIMIT, Embedder, pack, rank

__all__ = ["InMemoryMemoryStore", "MemoryStore", "query_terms"]

_WORD: Final = re.compile(r"\w+", re.UNICODE)


class MemoryStore(Protocol):
    """Namespaced key-value memory with TTL and recall, durable across restarts (but the
    in-memory one).

    Every method checks its input first and raises ``MemoryInputError`` naming the field before
    anything is written; a database failure raises ``StorageError``.
    """

    location: str
    """Where the items are kept, for people."""

    async def start(self) -> None:
        """Open the store (its tables created or migrated when needed)."""
        ...

    async def aclose(self) -> None:
        """Close the store; calls after it fail."""
        ...

    async def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: JsonValue,
        *,
        ttl_s: float | None = None,
    ) -> MemoryItem:
        """Write ``value`` under ``(namespace, key)``, replacing what was there.

        Args:
            namespace: Where to keep it, such as ``("user", "ana")``.
            key: The key within the namespace.
            value: Any JSON value (at most ``MemoryLimits.max_value_bytes`` as JSON).
            ttl_s: Seconds until the item expires; ``None`` keeps it until deleted.

        Returns:
            The item as stored.
        """
        ...

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None:
        """The item at ``(namespace, key)``, or ``None`` when there is none (or it expired)."""
        ...

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        """The items of ``namespace`` and the namespaces below it, by namespace then key."""
        ...

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        """Remove ``(namespace, key)``; whether there was such an item."""
        ...

    async def search(
        self,
        namespace: Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        """Recall the items of ``namespace`` (and below) best matching ``query``.

        Args:
            namespace: Where to look (that namespace and every namespace below it).
            query: Words to recall by; ``None`` or blank returns the newest items.
            filter: Field paths of the value and the JSON value each must equal
                (``{"status": "open", "author.name": "ana"}``).
            limit: The most items to return (1 to ``MemoryLimits.max_results``).

        Returns:
            The items, best match first, each with its ``score`` (``None`` without a query).
        """
        ...

    async def sweep(self) -> int:
        """Remove the items whose TTL has passed; how many were removed."""
        ...


def query_terms(query: str | None) -> list[str]:
    """The words of a query, lower-cased, each once, in order (at most 32)."""
    if query is None:
        return []
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:32]


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class InMemoryMemoryStore:
    """``MemoryStore`` in a dict, for tests: same checks and results, nothing durable.

    Text recall here scores an item by how many of the query's words its text holds.

    Args:
        limits: What it accepts.
        clock: Seconds since the epoch (tests pass a fake one to expire items).
        embedder: Where vectors come from; with one, ``search`` with a query recalls by cosine
            similarity (``_vectors``), else by words.
    """

    def __init__(
        self,
        *,
        limits: MemoryLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        embedder: Embedder | None = None,
    ) -> None:
        self.location = "memory"
        self.embedder = embedder
        self._vectors: dict[tuple[Namespace, str], bytes] = {}
        self.limits = limits
        self._clock = clock
        self._items: dict[tuple[Namespace, str], tuple[MemoryItem, float | None]] = {}

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _live(self, entry: tuple[MemoryItem, float | None], now: float) -> bool:
        return entry[1] is None or entry[1] > now

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
        if self.embedder is not None:
            body = searchable_text(key, json.loads(text))
            self._vectors[(ns, key)] = pack((await self.embedder.embed([body]))[0])
        now = self._clock()
        old = self._items.get((ns, key))
        created = old[0].created_at if old is not None and self._live(old, now) else _utc(now)
        expires = None if ttl is None else now + ttl
        item = MemoryItem(
            namespace=ns,
            key=key,
            value=json.loads(text),
            created_at=created,
            updated_at=_utc(now),
            expires_at=None if expires is None else _utc(expires),
        )
        self._items[(ns, key)] = (item, expires)
        return item

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        entry = self._items.get((ns, key))
        if entry is None or not self._live(entry, self._clock()):
            return None
        return entry[0]

    def _under(self, ns: Namespace) -> list[MemoryItem]:
        now = self._clock()
        found = [
            entry[0]
            for (where, _), entry in self._items.items()
            if where[: len(ns)] == ns and self._live(entry, now)
        ]
        return sorted(found, key=lambda item: (item.namespace, item.key))

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        ns = check_namespace(namespace, self.limits)
        check_limit(limit, self.limits)
        check_offset(offset)
        return self._under(ns)[offset : offset + limit]

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        ns = check_namespace(namespace, self.limits)
        key = check_key(key, self.limits)
        entry = self._items.pop((ns, key), None)
        self._vectors.pop((ns, key), None)
        return entry is not None and self._live(entry, self._clock())

    async def search(
        self,
        namespace: Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        ns = check_namespace(namespace, self.limits)
        text = check_query(query)
        filter_ = check_filter(filter)
        check_limit(limit, self.limits)
        terms = query_terms(text)
        if self.embedder is not None and terms:
            wanted = (await self.embedder.embed([text or ""]))[0]
            rows = [
                (self._vectors[(item.namespace, item.key)], item)
                for item in self._under(ns)
                if matches_filter(item.value, filter_)
                and (item.namespace, item.key) in self._vectors
            ]
            rows.sort(key=lambda row: row[1].updated_at, reverse=True)
            best = rank(wanted, rows[:VECTOR_SCAN_LIMIT], limit)
            return [replace(item, score=score) for score, item in best]
        scored: list[tuple[float, MemoryItem]] = []
        for item in self._under(ns):
            if not matches_filter(item.value, filter_):
                continue
            if terms:
                words = set(query_terms(searchable_text(item.key, item.value)))
                score = float(sum(term in words for term in terms))
                if score == 0:
                    continue
            else:
                score = item.updated_at.timestamp()
            scored.append((score, item))
        scored.sort(key=lambda pair: -pair[0])
        return [replace(item, score=score if terms else None) for score, item in scored[:limit]]

    async def sweep(self) -> int:
        now = self._clock()
        gone = [where for where, entry in self._items.items() if not self._live(entry, now)]
        for where in gone:
            del self._items[where]
        return len(gone)
