"""Where signed heads are kept: ``HeadsStore``, a file beside the log, or a mirrored pair.

``FileHeads`` is the default beside a SQLite log; ``PostgresAuditHeads`` (``_postgres``) keeps
them in a table beside a PostgreSQL log; ``MirroredHeads`` copies every head to a second store.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

__all__ = ["FileHeads", "HeadsStore", "MirroredHeads"]

logger = logging.getLogger(__name__)


class HeadsStore(Protocol):
    """Where signed heads are kept: appended to, read whole. A file (``FileHeads``) by default; a
    table of the store's database (``PostgresAuditHeads``) where nodes share no file system."""

    where: str
    """Where the heads are, for people (a path, or a database without its password)."""

    def append(self, line: bytes) -> None:
        """Add one signed-head line (it ends with a newline)."""

    def read(self) -> bytes | None:
        """Every line, in the order appended; ``None`` when no heads were ever kept here."""

    def tail(self) -> bytes:
        """The last lines (a few KiB at most): where a restarted sealer finds its last head."""


class FileHeads:
    """Signed heads in an append-only file (mode 0600), the default beside a SQLite log.

    Args:
        path: The file; created when missing, only ever appended to.
        fsync: Whether each append is fsynced.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._fsync = fsync

    def append(self, line: bytes) -> None:
        """Append ``line`` with one write on an O_APPEND descriptor (lines never interleave)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> bytes | None:
        """The file's bytes, or ``None`` when it is missing."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def tail(self) -> bytes:
        """The file's last 4 KiB (empty when missing)."""
        try:
            with self.path.open("rb") as file:
                size = file.seek(0, os.SEEK_END)
                file.seek(max(0, size - 4096))
                return file.read()
        except FileNotFoundError:
            return b""


class MirroredHeads:
    """Signed heads kept in a primary store and copied to another (an external sink).

    Every seal is appended to ``primary`` and then to ``copy``, say a file on another disk or a
    mount that whoever can write the state directory cannot rewrite. Reading gives the primary's
    lines followed by the copy's lines the primary lacks, so heads cut from the end of the primary
    (which its own chain cannot show) still verify against the log, and a rewritten log fails
    them. A copy that cannot be written is logged and sealing goes on (the primary has the head).

    Args:
        primary: Where heads are read first (the file beside the log, or the database table).
        copy: The second place every head is appended to.
    """

    def __init__(self, primary: HeadsStore, copy: HeadsStore) -> None:
        self.primary = primary
        self.copy = copy
        self.where = f"{primary.where} (copied to {copy.where})"

    def append(self, line: bytes) -> None:
        self.primary.append(line)
        try:
            self.copy.append(line)
        except OSError as exc:
            logger.warning("cannot copy a signed audit head to %s: %s", self.copy.where, exc)

    def read(self) -> bytes | None:
        first, second = self.primary.read(), self.copy.read()
        if first is None and second is None:
            return None
        kept = (first or b"").splitlines(keepends=True)
        if kept and not kept[-1].endswith(b"\n"):
            kept[-1] += b"\n"
        seen = set(kept)
        extra = [line for line in (second or b"").splitlines(keepends=True) if line not in seen]
        if extra and not extra[-1].endswith(b"\n"):
            extra[-1] += b"\n"
        return b"".join(kept + extra)

    def tail(self) -> bytes:
        return self.primary.tail()


def _heads_store(heads: Path | HeadsStore, *, fsync: bool = False) -> HeadsStore:
    if isinstance(heads, (str, os.PathLike)):
        return FileHeads(Path(heads), fsync=fsync)
    return heads
