"""Where an artifact's bytes live: content-addressed blobs, one per SHA-256 digest.

A ``BlobStore`` is a small protocol (put, get, has, delete, list) with an in-memory implementation
for tests and the local filesystem as the default; the S3-compatible backend implements the same.
Every read checks the digest: a blob whose bytes no longer hash to its name is never served.

The filesystem layout is ``ROOT/sha256/ab/abcdef...`` (the first two hex digits a folder, so no
folder holds millions of files); a blob is written to ``ROOT/tmp/`` first, then renamed into place
(atomic on one filesystem), so a crash or a full disk never leaves half a blob under a digest. A
temporary file left by a crash is removed by ``sweep_temporary``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from stratagem.planning._artifacts._errors import ArtifactCorruptError, ArtifactStorageError

__all__ = ["BlobStore", "FileBlobStore", "InMemoryBlobStore", "blob_digest", "write_whole"]

_NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def blob_digest(data: bytes) -> str:
    """The SHA-256 of ``data``, hex."""
    return hashlib.sha256(data).hexdigest()


_CHUNK: Final = 256 * 1024
"""Bytes read, hashed and written at a time when copying a file: small enough to stay in the
CPU's cache between the read, the hash and the write, large enough to keep system calls few."""


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_new(path: str | Path, data: bytes) -> None:
    """Create the file ``path`` (it must not exist; mode 0600) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, memoryview(data))
    finally:
        os.close(fd)


def _copy_hashing(reader: io.FileIO, fd: int) -> tuple[str, int]:
    """Copy ``reader`` to ``fd`` through one reused buffer, hashing each chunk as it passes; the
    SHA-256 (hex) of what was written, and its size."""
    hasher = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    size = 0
    while True:
        count = reader.readinto(view)
        if not count:
            return hasher.hexdigest(), size
        chunk = view[:count]
        hasher.update(chunk)
        _write_all(fd, chunk)
        size += count


def write_whole(target: Path, data: bytes, location: str) -> None:
    """Write ``data`` to the file ``target`` whole or not at all (a private temporary file in
    its folder, then renamed over it).

    Raises:
        ArtifactStorageError: the file cannot be written (naming it); ``target`` untouched.
    """
    tmp = target.parent / f".{target.name}.{os.getpid()}.{time.time_ns()}"
    try:
        _write_new(tmp, data)
        os.replace(tmp, target)
    except FileNotFoundError:
        tmp.unlink(missing_ok=True)
        raise ArtifactStorageError(
            f"cannot write {target}: its folder does not exist", location
        ) from None
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ArtifactStorageError(
            f"cannot write {target}: {exc.strerror or exc}", location
        ) from exc


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed bytes. Implementations are blocking (the ``ArtifactStore`` calls them on
    a thread) and safe to call from several threads."""

    @property
    def location(self) -> str:
        """Where the blobs are (a folder, a bucket URL), for messages."""
        ...

    def put(self, digest: str, data: bytes) -> bool:
        """Store ``data`` under ``digest`` (its SHA-256, checked by the caller); ``False`` when a
        blob was already there (identical bytes are stored once). All or nothing."""
        ...

    def get(self, digest: str) -> bytes:
        """The bytes under ``digest``, checked against it.

        Raises:
            ArtifactCorruptError: the blob is missing or its bytes do not hash to ``digest``.
        """
        ...

    def put_file(self, source: Path) -> tuple[str, bool]:
        """Store the file ``source`` (a private copy is made first, then hashed, so a file that
        changes meanwhile never lands under a wrong digest); its digest, and whether a blob was
        written. All or nothing."""
        ...

    def get_file(self, digest: str, target: Path) -> None:
        """Write the blob under ``digest`` to ``target``, whole and checked, or not at all.

        Raises:
            ArtifactCorruptError: the blob is missing or its bytes do not hash to ``digest``.
        """
        ...

    def has(self, digest: str) -> bool:
        """Whether a blob is stored under ``digest`` (its bytes not read)."""
        ...

    def delete(self, digest: str) -> None:
        """Remove the blob (nothing when it is missing)."""
        ...

    def blobs(self) -> Iterator[tuple[str, float]]:
        """Every stored digest with the time its blob was written (seconds since the epoch)."""
        ...

    def sweep_temporary(self, older_than: float) -> int:
        """Remove unfinished writes begun before ``older_than``; how many were removed."""
        ...


def _checked(digest: str, data: bytes, location: str) -> bytes:
    if blob_digest(data) != digest:
        raise ArtifactCorruptError(digest, location, "does not match its digest (corrupted)")
    return data


class InMemoryBlobStore:
    """Blobs in a dict, for tests. ``corrupt(digest)`` flips a byte, as a bad disk would."""

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return "memory"

    def put(self, digest: str, data: bytes) -> bool:
        with self._lock:
            if digest in self._blobs:
                return False
            self._blobs[digest] = (bytes(data), time.time())
            return True

    def get(self, digest: str) -> bytes:
        with self._lock:
            entry = self._blobs.get(digest)
        if entry is None:
            raise ArtifactCorruptError(digest, self.location, "is missing")
        return _checked(digest, entry[0], self.location)

    def put_file(self, source: Path) -> tuple[str, bool]:
        data = source.read_bytes()
        digest = blob_digest(data)
        return digest, self.put(digest, data)

    def get_file(self, digest: str, target: Path) -> None:
        target.write_bytes(self.get(digest))

    def has(self, digest: str) -> bool:
        with self._lock:
            return digest in self._blobs

    def delete(self, digest: str) -> None:
        with self._lock:
            self._blobs.pop(digest, None)

    def blobs(self) -> Iterator[tuple[str, float]]:
        with self._lock:
            items = [(d, t) for d, (_, t) in self._blobs.items()]
        return iter(items)

    def sweep_temporary(self, older_than: float) -> int:
        return 0

    def corrupt(self, digest: str) -> None:
        """Flip the first byte of a blob (tests)."""
        with self._lock:
            data, at = self._blobs[digest]
            self._blobs[digest] = (bytes([data[0] ^ 0xFF]) + data[1:] if data else b"x", at)


class FileBlobStore:
    """Blobs as files under a folder: ``ROOT/sha256/ab/<digest>``, written through ``ROOT/tmp``.

    A write is not fsynced: a blob that was written survives a crash of the process (the page
    cache keeps it), as the SQLite index's ``synchronous=NORMAL`` commits do; a power loss may
    lose the newest blobs, which a read then names as missing.

    Args:
        root: The folder (created when missing, mode 0700).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._blobs = self.root / "sha256"
        self._tmp = self.root / "tmp"
        self._blobs_dir = f"{self._blobs}{os.sep}"
        self._tmp_dir = f"{self._tmp}{os.sep}"
        try:
            self._blobs.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ArtifactStorageError(
                f"cannot create the blob folder {self.root}: {exc.strerror or exc}", str(root)
            ) from exc

    @property
    def location(self) -> str:
        return str(self.root)

    def path(self, digest: str) -> Path:
        """The file of the blob under ``digest``."""
        return self._blobs / digest[:2] / digest

    def put(self, digest: str, data: bytes) -> bool:
        # Paths as plain strings: a small save's cost is its few system calls, and ``Path``
        # arithmetic around them was a measurable part of it.
        target = f"{self._blobs_dir}{digest[:2]}{os.sep}{digest}"
        if os.path.exists(target):
            return False
        tmp = self._temporary_name(digest)
        try:
            _write_new(tmp, data)
            self._place(tmp, target)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise self._failed(exc, len(data)) from exc
        return True

    def _place(self, tmp: str | Path, target: str | Path) -> None:
        # The shard folder is made only when the rename finds it missing: one system call
        # fewer on every save but the first of its 256 folders.
        try:
            os.replace(tmp, target)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):  # another save made it meanwhile
                os.mkdir(os.path.dirname(target), 0o700)
            os.replace(tmp, target)

    def get(self, digest: str) -> bytes:
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactCorruptError(digest, str(path), "is missing") from None
        except OSError as exc:
            raise ArtifactStorageError(
                f"cannot read the blob {path}: {exc.strerror or exc}", self.location
            ) from exc
        return _checked(digest, data, str(path))

    def _temporary_name(self, what: str) -> str:
        return f"{self._tmp_dir}{what}.{os.getpid()}.{threading.get_ident()}.{time.time_ns()}"

    def _temporary(self, what: str) -> Path:
        return Path(self._temporary_name(what))

    def _failed(self, exc: OSError, size: int) -> ArtifactStorageError:
        if exc.errno in _NO_SPACE:
            return ArtifactStorageError(
                f"no space left to write a blob of {size} bytes in {self.root} "
                f"({exc.strerror}); nothing was saved",
                self.location,
            )
        return ArtifactStorageError(
            f"cannot write a blob in {self.root}: {exc.strerror or exc}; nothing was saved",
            self.location,
        )

    def put_file(self, source: Path) -> tuple[str, bool]:
        # One pass: each chunk read from the source is hashed and written to the private
        # temporary file, so the bytes hashed are exactly those stored, whatever happens to the
        # source meanwhile, and every byte crosses the process once (no second read to hash).
        tmp = self._temporary("file")
        size = 0
        try:
            with source.open("rb", buffering=0) as reader:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    digest, size = _copy_hashing(reader, fd)
                finally:
                    os.close(fd)
            target = self.path(digest)
            if target.exists():
                tmp.unlink()
                return digest, False
            self._place(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._failed(exc, size) from exc
        return digest, True

    def get_file(self, digest: str, target: Path) -> None:
        path = self.path(digest)
        tmp = target.parent / f".{target.name}.{os.getpid()}.{time.time_ns()}"
        try:
            reader = path.open("rb", buffering=0)
        except FileNotFoundError:
            raise ArtifactCorruptError(digest, str(path), "is missing") from None
        except OSError as exc:
            raise ArtifactStorageError(
                f"cannot read the blob {path}: {exc.strerror or exc}", self.location
            ) from exc
        try:
            with reader:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    found, _ = _copy_hashing(reader, fd)
                finally:
                    os.close(fd)
            if found != digest:
                tmp.unlink()
                raise ArtifactCorruptError(
                    digest, str(path), "does not match its digest (corrupted)"
                )
            os.replace(tmp, target)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise ArtifactStorageError(
                f"cannot write {target}: its folder does not exist", self.location
            ) from None
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ArtifactStorageError(
                f"cannot write {target}: {exc.strerror or exc}", self.location
            ) from exc

    def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    def delete(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    def blobs(self) -> Iterator[tuple[str, float]]:
        for folder in sorted(self._blobs.iterdir()):
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                if entry.is_file():
                    try:
                        yield entry.name, entry.stat().st_mtime
                    except FileNotFoundError:
                        continue

    def sweep_temporary(self, older_than: float) -> int:
        removed = 0
        for entry in os.scandir(self._tmp):
            try:
                if entry.stat().st_mtime < older_than:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
