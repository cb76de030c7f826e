"""Answers a server keeps by (caller, request_id), so a repeated request gets the same answer.

A cross-agent step keeps its ``request_id`` on every attempt and across a restart of its caller, so
the target answers a repeated request from this store and its handler does not run twice. With
``SqliteAnswerStore`` that holds across a restart of the *target* too: the answer is committed
before it is sent. A request id reused for a different payload is told apart by the stored
request digest (the server answers ``FAILED_PRECONDITION``).

Retention is bounded by count and by age (``AnswerRetention``); the oldest answers go first. A
request repeated after its answer was dropped runs its handler again, so the age should exceed the
longest time a caller may retry or resume a step.

Every store is used from one event loop. ``SqliteAnswerStore`` (``_sqlite``) and
``PostgresAnswerStore`` (``_postgres``) keep answers across restarts.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "AnswerRetention",
    "AnswerStore",
    "InMemoryAnswerStore",
    "StoredAnswer",
]


@dataclass(frozen=True, slots=True)
class AnswerRetention:
    """How many answers a store keeps, and for how long.

    Attributes:
        max_entries: The most answers kept; the oldest go first (0 keeps none).
        max_age_s: Answers older than this are dropped.
        max_bytes: The most answer bytes kept (the in-memory store only).
    """

    max_entries: int = 100_000
    max_age_s: float = 7 * 24 * 3600.0
    max_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_entries < 0:
            raise ProtocolUsageError("AnswerRetention.max_entries must be >= 0")
        if self.max_age_s <= 0 or self.max_bytes <= 0:
            raise ProtocolUsageError("AnswerRetention.max_age_s and max_bytes must be positive")


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """One stored answer.

    Attributes:
        request_digest: The digest of the request it answered.
        answer: The encoded response.
        stored_at: When it was stored (seconds since the epoch).
    """

    request_digest: str
    answer: bytes
    stored_at: float


@runtime_checkable
class AnswerStore(Protocol):
    """Successful answers by (caller, request_id)."""

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer stored for this caller's request id, if it is still kept."""
        ...

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Store an answer; it is durable (for a durable store) when this returns."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources."""
        ...


class InMemoryAnswerStore:
    """Answers in memory, bounded by count, bytes and age; lost with the process.

    Args:
        retention: The bounds; ``AnswerRetention()`` by default.
        clock: Seconds since the epoch (inject one in tests).
    """

    def __init__(
        self, retention: AnswerRetention | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._retention = retention or AnswerRetention()
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], StoredAnswer] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, caller: str, request_id: str) -> StoredAnswer | None:
        """The answer, unless it expired (see ``AnswerStore.get``)."""
        key = (caller, request_id)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.stored_at < self._clock() - self._retention.max_age_s:
            self._drop(key)
            return None
        return entry

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        """Keep an answer, dropping the oldest beyond the bounds (see ``AnswerStore.put``)."""
        retention = self._retention
        if retention.max_entries == 0 or len(answer) > retention.max_bytes:
            return
        key = (caller, request_id)
        self._drop(key)
        self._entries[key] = StoredAnswer(request_digest, answer, self._clock())
        self._bytes += len(answer)
        horizon = self._clock() - retention.max_age_s
        while self._entries and (
            len(self._entries) > retention.max_entries
            or self._bytes > retention.max_bytes
            or next(iter(self._entries.values())).stored_at < horizon
        ):
            self._drop(next(iter(self._entries)))

    async def aclose(self) -> None:
        """Forget every answer."""
        self._entries.clear()
        self._bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry.answer)
