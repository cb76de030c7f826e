"""The artifact store: content-addressed blobs plus versioned records with provenance.

``ArtifactStore`` composes a ``BlobStore`` (the bytes) and an ``ArtifactIndex`` (the records) and
is the one API every caller uses: the plan tools, the CLI, the Python client, the console and the
research workflow. Its methods are coroutines that run the blocking backends on a thread.

A save checks its input first (name, scope, media type against the bytes, size), writes the blob
(temporary file, then rename), then adds the record in one transaction. A small artifact (at most
``ArtifactsConfig.index_bytes``) has no blob: the index keeps its bytes with its record, in the
record's transaction, so the save is one write. So a failed or killed save
leaves no record; at worst a blob no record names, which ``sweep`` removes once it is older than
the grace period (a save in progress is never swept from under its record). A save of bytes the
name already has (same plan step, or its newest version) answers the stored version: a step run
again after a crash makes no second version.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TypeVar

from stratagem.planning._artifacts._blobs import (
    BlobStore,
    FileBlobStore,
    InMemoryBlobStore,
    blob_digest,
    write_whole,
)
from stratagem.planning._artifacts._checks import (
    SNIFFED_BYTES,
    check_digest,
    check_media_type,
    check_name,
    check_scope,
    needs_whole,
)
from stratagem.planning._artifacts._errors import (
    ArtifactCorruptError,
    ArtifactInputError,
    ArtifactNotFoundError,
    ArtifactTooLargeError,
)
from stratagem.planning._artifacts._index import ArtifactIndex, InMemoryArtifactIndex
from stratagem.planning._artifacts._types import (
    ArtifactProvenance,
    ArtifactRecord,
    ArtifactRef,
    ArtifactRetention,
    ArtifactScope,
)

__all__ = [
    "ARTIFACT_INDEX_BYTES_MAX",
    "ARTIFACT_MAX_BYTES",
    "ArtifactLineage",
    "ArtifactStore",
    "ArtifactSweep",
    "ArtifactsConfig",
]

T = TypeVar("T")

ARTIFACT_MAX_BYTES: Final = 1 << 30
"""The default limit on one artifact's size: 1 GiB."""

ARTIFACT_INDEX_BYTES_MAX: Final = 256 * 1024
"""The most ``ArtifactsConfig.index_bytes`` may be: larger bytes belong in a blob store. A read of
an artifact up to this size asks the index first (whatever the setting was when it was saved)."""


@dataclass(frozen=True, slots=True)
class ArtifactsConfig:
    """How an artifact store behaves.

    Attributes:
        max_bytes: The largest artifact saved, in bytes.
        sweep_grace_s: A blob no record names is removed by ``sweep`` only once it is this old
            (a save writes its blob before its record).
        retention: Per scope, how long its artifacts are kept (``prune``); a scope not named
            keeps everything.
        on_loop_bytes: A ``save`` of at most this many bytes, on a store whose backends are on
            this machine (``open``, ``in_memory``), runs on the caller's thread: writing a small
            file and committing one SQLite row takes less than handing the work to a thread and
            back (which cost a small save about as much as the rest of its step). Larger saves,
            and every save to a remote backend, run on a worker thread. 0: always a thread.
    """

    max_bytes: int = ARTIFACT_MAX_BYTES
    sweep_grace_s: float = 3600.0
    retention: Mapping[ArtifactScope, ArtifactRetention] = field(default_factory=dict)
    on_loop_bytes: int = 64 * 1024
    index_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError("max_bytes: must be >= 1")
        if self.on_loop_bytes < 0:
            raise ValueError("on_loop_bytes: must be >= 0")
        if self.sweep_grace_s < 0:
            raise ValueError("sweep_grace_s: must be >= 0")
        if not 0 <= self.index_bytes <= ARTIFACT_INDEX_BYTES_MAX:
            raise ValueError(f"index_bytes: must be between 0 and {ARTIFACT_INDEX_BYTES_MAX}")


@dataclass(frozen=True, slots=True)
class ArtifactLineage:
    """An artifact's provenance with the artifacts it was made from.

    Attributes:
        record: The artifact.
        inputs: The stored artifacts whose digests are among its provenance's inputs.
        unknown_inputs: Input digests no stored artifact has (inline inputs, removed artifacts).
    """

    record: ArtifactRecord
    inputs: tuple[ArtifactRecord, ...] = ()
    unknown_inputs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArtifactSweep:
    """What ``ArtifactStore.sweep`` removed.

    Attributes:
        blobs: Digests of blobs no record named.
        temporary: Unfinished writes removed.
    """

    blobs: tuple[str, ...] = ()
    temporary: int = 0


class ArtifactStore:
    """Versioned, scoped artifacts with provenance over content-addressed blobs.

    Args:
        blobs: Where the bytes go.
        index: Where the records go.
        config: Limits and retention.
        clock: Seconds since the epoch (tests pass their own).
        local: Both backends are on this machine (a folder, SQLite, memory), so a small save
            may run on the caller's thread (``ArtifactsConfig.on_loop_bytes``); ``open`` and
            ``in_memory`` say so, a store built on S3 or PostgreSQL should not.
    """

    def __init__(
        self,
        blobs: BlobStore,
        index: ArtifactIndex,
        config: ArtifactsConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        local: bool = False,
    ) -> None:
        self.blobs = blobs
        self.index = index
        self.config = config or ArtifactsConfig()
        self._clock = clock
        self._on_loop_bytes = self.config.on_loop_bytes if local else 0

    @classmethod
    def open(
        cls, folder: str | os.PathLike[str], config: ArtifactsConfig | None = None
    ) -> ArtifactStore:
        """The embedded store in ``folder``: blobs under ``folder/blobs``, records in
        ``folder/index.sqlite3``."""
        from stratagem.planning._artifacts._sqlite import SqliteArtifactIndex

        root = Path(folder)
        return cls(
            FileBlobStore(root / "blobs"),
            SqliteArtifactIndex(root / "index.sqlite3"),
            config,
            local=True,
        )

    @classmethod
    def in_memory(cls, config: ArtifactsConfig | None = None) -> ArtifactStore:
        """A store in memory (tests)."""
        return cls(InMemoryBlobStore(), InMemoryArtifactIndex(), config, local=True)

    @property
    def location(self) -> str:
        """Where the records and the blobs are."""
        return f"{self.index.location} + {self.blobs.location}"

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.to_thread(fn, *args)

    # --- writing -----------------------------------------------------------------------------

    def check(
        self,
        name: str,
        data: bytes,
        *,
        media_type: str,
        scope: str = "deployment",
        scope_id: str = "",
    ) -> tuple[str, ArtifactScope]:
        """Check a save's input without writing (the media type normalised, and the scope).

        Raises:
            ArtifactInputError: naming the field at fault (``ArtifactTooLargeError`` for size).
        """
        check_name(name)
        checked_scope = check_scope(scope, scope_id)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ArtifactInputError("data", "must be bytes")
        if len(data) > self.config.max_bytes:
            raise ArtifactTooLargeError(len(data), self.config.max_bytes)
        return check_media_type(media_type, bytes(data)), checked_scope

    def save_blocking(
        self,
        name: str,
        data: bytes,
        *,
        media_type: str,
        scope: str = "deployment",
        scope_id: str = "",
        provenance: ArtifactProvenance | None = None,
    ) -> ArtifactRecord:
        """``save`` on this thread (for code that is not on an event loop)."""
        media, checked_scope = self.check(
            name, data, media_type=media_type, scope=scope, scope_id=scope_id
        )
        data = bytes(data)
        digest = blob_digest(data)
        now = self._clock()
        prov = provenance or ArtifactProvenance()
        if not prov.time:
            prov = replace(prov, time=now)
        kept = len(data) <= self.config.index_bytes
        if not kept:
            self.blobs.put(digest, data)
        record, _ = self.index.add(
            ArtifactRecord(
                name=name,
                version=0,
                media_type=media,
                size=len(data),
                digest=digest,
                scope=checked_scope,
                scope_id=scope_id,
                created_at=now,
                provenance=prov,
            ),
            data if kept else None,
        )
        return record

    async def save(
        self,
        name: str,
        data: bytes,
        *,
        media_type: str,
        scope: str = "deployment",
        scope_id: str = "",
        provenance: ArtifactProvenance | None = None,
    ) -> ArtifactRecord:
        """Save ``data`` as the next version of ``name`` in its scope.

        Idempotent by digest: bytes the name already holds as its newest version, or saved by
        the same plan step before, answer that version instead of a new one.

        Args:
            name: The artifact's name (no ``..``, no slash).
            data: Its bytes (at most ``config.max_bytes``).
            media_type: What they are; checked against the bytes where the store can tell.
            scope: ``plan``, ``goal``, ``agent`` or ``deployment``.
            scope_id: The plan, goal or agent id ("" for the deployment).
            provenance: Who made it (its ``time`` set to now when 0).

        Returns:
            The stored record (with its version).

        Raises:
            ArtifactInputError: bad input, naming the field; nothing written.
            ArtifactStorageError: the backend failed (a full disk); no record written.
        """

        def save() -> ArtifactRecord:
            return self.save_blocking(
                name,
                data,
                media_type=media_type,
                scope=scope,
                scope_id=scope_id,
                provenance=provenance,
            )

        if isinstance(data, bytes | bytearray | memoryview) and len(data) <= self._on_loop_bytes:
            return save()
        return await self._run(save)

    def save_file_blocking(
        self,
        name: str,
        source: str | os.PathLike[str],
        *,
        media_type: str,
        scope: str = "deployment",
        scope_id: str = "",
        provenance: ArtifactProvenance | None = None,
    ) -> ArtifactRecord:
        """``save_file`` on this thread."""
        path = Path(source)
        try:
            size = path.stat().st_size
            if needs_whole(media_type) or size <= SNIFFED_BYTES:
                data = path.read_bytes()
            else:
                with path.open("rb") as handle:
                    data = handle.read(SNIFFED_BYTES)
        except OSError as exc:
            raise ArtifactInputError(
                "source", f"cannot read {path}: {exc.strerror or exc}"
            ) from exc
        if len(data) == size:  # all of it was read: the bytes' own path
            return self.save_blocking(
                name,
                data,
                media_type=media_type,
                scope=scope,
                scope_id=scope_id,
                provenance=provenance,
            )
        if size > self.config.max_bytes:
            raise ArtifactTooLargeError(size, self.config.max_bytes)
        media, checked_scope = self.check(
            name, data, media_type=media_type, scope=scope, scope_id=scope_id
        )
        digest, _ = self.blobs.put_file(path)
        now = self._clock()
        prov = provenance or ArtifactProvenance()
        if not prov.time:
            prov = replace(prov, time=now)
        record, _ = self.index.add(
            ArtifactRecord(
                name=name,
                version=0,
                media_type=media,
                size=size,
                digest=digest,
                scope=checked_scope,
                scope_id=scope_id,
                created_at=now,
                provenance=prov,
            )
        )
        return record

    async def save_file(
        self,
        name: str,
        source: str | os.PathLike[str],
        *,
        media_type: str,
        scope: str = "deployment",
        scope_id: str = "",
        provenance: ArtifactProvenance | None = None,
    ) -> ArtifactRecord:
        """``save`` of a file's bytes without holding them in memory: the file is copied in one
        pass through a small reused buffer to a private temporary file, each chunk hashed as it
        passes, then renamed into place (a text or JSON type, checked against the whole bytes,
        is read whole). Same checks, same
        idempotence, same errors as ``save`` (a file that cannot be read: ``source``)."""
        return await self._run(
            lambda: self.save_file_blocking(
                name,
                source,
                media_type=media_type,
                scope=scope,
                scope_id=scope_id,
                provenance=provenance,
            )
        )

    # --- reading -----------------------------------------------------------------------------

    def record_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """``record`` on this thread."""
        check_name(name)
        checked = check_scope(scope, scope_id)
        if version is not None and version < 1:
            raise ArtifactInputError("version", f"{version} must be >= 1")
        found = self.index.get(checked, scope_id, name, version)
        if found is None:
            at = "" if version is None else f"@{version}"
            raise ArtifactNotFoundError(f"{scope}/{scope_id}/{name}{at}")
        return found

    async def record(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """One version's record (the newest when ``version`` is ``None``).

        Raises:
            ArtifactNotFoundError: no such artifact or version.
            ArtifactInputError: a malformed name, scope or version.
        """
        return await self._run(
            lambda: self.record_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    def load_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> tuple[ArtifactRecord, bytes]:
        """``load`` on this thread."""
        found = self.record_blocking(name, scope=scope, scope_id=scope_id, version=version)
        return found, self.bytes_blocking(found.digest, found.size)

    async def load(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> tuple[ArtifactRecord, bytes]:
        """One version's record and bytes (the newest when ``version`` is ``None``).

        Raises:
            ArtifactNotFoundError: no such artifact or version.
            ArtifactCorruptError: its blob is missing or does not match its digest (never served).
        """
        return await self._run(
            lambda: self.load_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    def load_file_blocking(
        self,
        name: str,
        target: str | os.PathLike[str],
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """``load_file`` on this thread."""
        found = self.record_blocking(name, scope=scope, scope_id=scope_id, version=version)
        kept = self._kept(found.digest, found.size)
        if kept is None:
            self.blobs.get_file(found.digest, Path(target))
        else:
            write_whole(Path(target), kept, self.location)
        return found

    async def load_file(
        self,
        name: str,
        target: str | os.PathLike[str],
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """Write one version's bytes to the file ``target``, whole and digest-checked, or not at
        all (copied in one pass through a small buffer, hashed as it passes, then renamed into
        place); its record.

        Raises:
            ArtifactNotFoundError: no such artifact or version.
            ArtifactCorruptError: its blob is missing or corrupted (``target`` untouched).
        """
        return await self._run(
            lambda: self.load_file_blocking(
                name, target, scope=scope, scope_id=scope_id, version=version
            )
        )

    async def load_ref(self, ref: ArtifactRef) -> bytes:
        """The bytes a reference names, checked against its digest."""
        check_digest(ref.digest, "digest")
        if self._on_loop_bytes and ref.size <= self._on_loop_bytes:
            return self.bytes_blocking(ref.digest, ref.size)
        return await self._run(self.bytes_blocking, ref.digest, ref.size)

    def _kept(self, digest: str, size: int | None) -> bytes | None:
        """The bytes the index keeps under ``digest``, checked; ``None`` when it has none."""
        if size is not None and size > ARTIFACT_INDEX_BYTES_MAX:
            return None
        data = self.index.kept(digest)
        if data is None:
            return None
        if blob_digest(data) != digest:
            raise ArtifactCorruptError(
                digest,
                f"{self.index.location} (kept with its record)",
                "does not match its digest (corrupted)",
            )
        return data

    def bytes_blocking(self, digest: str, size: int | None = None) -> bytes:
        """The bytes of ``digest``, checked against it, wherever they are kept (the index for a
        small artifact, else the blob store); ``size`` when known spares a large artifact the
        index's lookup.

        Raises:
            ArtifactCorruptError: they are missing or do not match the digest (never served).
        """
        kept = self._kept(digest, size)
        return self.blobs.get(digest) if kept is None else kept

    def list_blocking(
        self,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        latest: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        """``list`` on this thread."""
        checked: ArtifactScope | None = None
        if scope is not None:
            checked = check_scope(scope, scope_id or ("" if scope == "deployment" else "x"))
        if name is not None:
            check_name(name)
        return self.index.list(scope=checked, scope_id=scope_id, name=name, latest=latest)

    async def list(
        self,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        latest: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        """Records by scope, scope id, name, version (each name's newest only with ``latest``).

        Raises:
            ArtifactInputError: a malformed scope or name.
        """
        return await self._run(
            lambda: self.list_blocking(scope=scope, scope_id=scope_id, name=name, latest=latest)
        )

    def provenance_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactLineage:
        """``provenance`` on this thread."""
        found = self.record_blocking(name, scope=scope, scope_id=scope_id, version=version)
        inputs: builtins.list[ArtifactRecord] = []
        unknown: builtins.list[str] = []
        for digest in found.provenance.inputs:
            made = self.index.with_digest(digest)
            inputs.extend(made)
            if not made:
                unknown.append(digest)
        return ArtifactLineage(found, tuple(inputs), tuple(unknown))

    async def provenance(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactLineage:
        """An artifact's provenance, with the stored artifacts among its inputs."""
        return await self._run(
            lambda: self.provenance_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    # --- housekeeping ------------------------------------------------------------------------

    def prune_blocking(self, now: float | None = None) -> builtins.list[ArtifactRecord]:
        """``prune`` on this thread."""
        now = self._clock() if now is None else now
        removed: builtins.list[ArtifactRecord] = []
        for scope, rule in self.config.retention.items():
            versions = self.index.list(scope=scope)
            by_name: dict[tuple[str, str], builtins.list[ArtifactRecord]] = {}
            for r in versions:
                by_name.setdefault((r.scope_id, r.name), []).append(r)
            for records in by_name.values():
                newest = records[-1]
                for position, r in enumerate(reversed(records)):
                    too_many = rule.max_versions is not None and position >= rule.max_versions
                    too_old = rule.max_age_s is not None and now - r.created_at > rule.max_age_s
                    if too_old and r is newest and rule.keep_latest:
                        too_old = False
                    if too_many or too_old:
                        removed.append(r)
        self.index.remove(removed)
        return removed

    async def prune(self, now: float | None = None) -> builtins.list[ArtifactRecord]:
        """Remove the versions the retention rules no longer keep (their blobs go at ``sweep``).

        Returns:
            The records removed.
        """
        return await self._run(self.prune_blocking, now)

    def sweep_blocking(self, grace_s: float | None = None) -> ArtifactSweep:
        """``sweep`` on this thread."""
        grace = self.config.sweep_grace_s if grace_s is None else grace_s
        cutoff = self._clock() - grace
        temporary = self.blobs.sweep_temporary(cutoff)
        candidates = [d for d, written in self.blobs.blobs() if written <= cutoff]
        named = self.index.digests()
        removed: builtins.list[str] = []
        for digest in candidates:
            if digest not in named:
                self.blobs.delete(digest)
                removed.append(digest)
        return ArtifactSweep(tuple(removed), temporary)

    async def sweep(self, grace_s: float | None = None) -> ArtifactSweep:
        """Remove blobs no record names and unfinished writes, older than the grace period
        (``config.sweep_grace_s`` unless given)."""
        return await self._run(self.sweep_blocking, grace_s)

    async def aclose(self) -> None:
        """Close the index's connections."""
        await self._run(self.index.close)
