"""Where artifact records live: the ``ArtifactIndex`` protocol and its in-memory implementation.

An index keeps the records (name, version, media type, size, digest, scope, provenance); the bytes
are in a ``BlobStore``, except a small artifact's, which the index keeps with its record (``add``
with ``data``, in the record's own transaction: no blob file, no second write to wait for).
``add`` is the one place a version is assigned, in one transaction with the
check that makes a save idempotent by digest (``same_save``): saving bytes a name already has, from
the same plan step or as its newest version, answers the stored record instead of a new version.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from stratagem.planning._artifacts._types import ArtifactRecord, ArtifactScope

__all__ = ["ArtifactIndex", "InMemoryArtifactIndex", "same_save"]


def same_save(versions: Sequence[ArtifactRecord], record: ArtifactRecord) -> ArtifactRecord | None:
    """The stored version that ``record`` (not yet versioned) repeats, if any.

    ``versions`` are the name's versions, oldest first. A save repeats a version when the bytes
    are the same and either it comes from the same plan step (a step run again after a crash) or
    the name's newest version already holds those bytes.
    """
    prov = record.provenance
    if prov.plan_id:
        for old in versions:
            if (
                old.digest == record.digest
                and old.provenance.plan_id == prov.plan_id
                and old.provenance.step_id == prov.step_id
            ):
                return old
    if versions and versions[-1].digest == record.digest:
        return versions[-1]
    return None


@runtime_checkable
class ArtifactIndex(Protocol):
    """The artifact records. Blocking (the ``ArtifactStore`` calls it on a thread); several
    processes may share a durable one."""

    @property
    def location(self) -> str:
        """Where the records are, for messages."""
        ...

    def add(self, record: ArtifactRecord, data: bytes | None = None) -> tuple[ArtifactRecord, bool]:
        """Store ``record`` (its ``version`` ignored) as the name's next version, or answer the
        version it repeats (``same_save``); ``True`` when a version was added.

        ``data``: the bytes themselves (their SHA-256 is ``record.digest``), kept by the index
        under the digest in the same transaction as the record, instead of in a blob store.
        """
        ...

    def kept(self, digest: str) -> bytes | None:
        """The bytes ``add`` kept under ``digest`` (not checked), or ``None``."""
        ...

    def get(
        self, scope: ArtifactScope, scope_id: str, name: str, version: int | None
    ) -> ArtifactRecord | None:
        """One version (the newest when ``version`` is ``None``)."""
        ...

    def list(
        self,
        *,
        scope: ArtifactScope | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        latest: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        """Records, by scope, scope id, name then version; only each name's newest when
        ``latest``."""
        ...

    def with_digest(self, digest: str) -> builtins.list[ArtifactRecord]:
        """Every record of the blob ``digest``."""
        ...

    def remove(self, records: Iterable[ArtifactRecord]) -> int:
        """Remove these versions, and the kept bytes no record names any more; how many versions
        were there."""
        ...

    def digests(self) -> set[str]:
        """Every digest a record names (what the sweep keeps)."""
        ...

    def close(self) -> None:
        """Release connections (the records stay)."""
        ...


def _order(r: ArtifactRecord) -> tuple[str, str, str, int]:
    return (r.scope, r.scope_id, r.name, r.version)


def newest_only(records: Sequence[ArtifactRecord]) -> builtins.list[ArtifactRecord]:
    """Each name's newest version among ``records`` (sorted by ``_order``)."""
    out: dict[tuple[str, str, str], ArtifactRecord] = {}
    for r in records:
        out[(r.scope, r.scope_id, r.name)] = r
    return list(out.values())


class InMemoryArtifactIndex:
    """Records in a list, for tests and for a store that needs no durability."""

    def __init__(self) -> None:
        self._records: builtins.list[ArtifactRecord] = []
        self._kept: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return "memory"

    def add(self, record: ArtifactRecord, data: bytes | None = None) -> tuple[ArtifactRecord, bool]:
        with self._lock:
            versions = sorted(
                (
                    r
                    for r in self._records
                    if (r.scope, r.scope_id, r.name) == (record.scope, record.scope_id, record.name)
                ),
                key=_order,
            )
            old = same_save(versions, record)
            if old is not None:
                return old, False
            stored = replace(record, version=versions[-1].version + 1 if versions else 1)
            self._records.append(stored)
            if data is not None:
                self._kept.setdefault(record.digest, bytes(data))
            return stored, True

    def kept(self, digest: str) -> bytes | None:
        with self._lock:
            return self._kept.get(digest)

    def corrupt(self, digest: str) -> None:
        """Flip the first byte of kept bytes (tests)."""
        with self._lock:
            data = self._kept[digest]
            self._kept[digest] = bytes([data[0] ^ 0xFF]) + data[1:] if data else b"x"

    def get(
        self, scope: ArtifactScope, scope_id: str, name: str, version: int | None
    ) -> ArtifactRecord | None:
        found = self.list(scope=scope, scope_id=scope_id, name=name)
        if version is None:
            return found[-1] if found else None
        return next((r for r in found if r.version == version), None)

    def list(
        self,
        *,
        scope: ArtifactScope | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        latest: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        with self._lock:
            found = sorted(
                (
                    r
                    for r in self._records
                    if (scope is None or r.scope == scope)
                    and (scope_id is None or r.scope_id == scope_id)
                    and (name is None or r.name == name)
                ),
                key=_order,
            )
        return newest_only(found) if latest else found

    def with_digest(self, digest: str) -> builtins.list[ArtifactRecord]:
        with self._lock:
            return sorted((r for r in self._records if r.digest == digest), key=_order)

    def remove(self, records: Iterable[ArtifactRecord]) -> int:
        keys = {_order(r) for r in records}
        with self._lock:
            before = len(self._records)
            self._records = [r for r in self._records if _order(r) not in keys]
            named = {r.digest for r in self._records}
            self._kept = {d: b for d, b in self._kept.items() if d in named}
            return before - len(self._records)

    def digests(self) -> set[str]:
        with self._lock:
            return {r.digest for r in self._records}

    def close(self) -> None:
        return None
