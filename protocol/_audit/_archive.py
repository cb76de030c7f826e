"""Audit retention: old records move to archived segments, and the chain verifies across them.

``archive_audit`` writes the records up to a ``seq`` to one segment file, then deletes them from
the live log (SQLite or PostgreSQL). A segment is gzip-compressed JSON lines, one record per line
with every field (``hash`` and ``prev_hash`` included), named for the records it holds::

    audit-000000000001-000000012345.jsonl.gz

It is written beside under a temporary name, fsynced, renamed into place (mode 0600), and only
then are the records deleted: a crash in between leaves the records in both places, which
``all_records`` reads once (a live copy that differs from the archived one is kept, so
verification flags it). The live log's last record always stays, so new records chain on from
it: nothing about the chain changes, only where its oldest records are kept.

``all_records`` yields the archived records, segment after segment in ``seq`` order, then the live
ones: ``verify_chain`` and ``verify_sealed`` check the whole chain, links between segments and
signed heads of archived records included. A segment that is deleted, damaged or edited fails
verification (records missing; a hash that does not match), so segments can be moved to cheaper
storage but not dropped: whoever keeps them decides how long; verify then needs them back
(``stratagem audit verify --archive DIR``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from stratagem.protocol._audit._log import AuditLog, AuditRecord
from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "ArchivableAuditLog",
    "ArchiveError",
    "ArchivedSegment",
    "all_records",
    "archive_audit",
    "archived_segments",
]

_NAME: Final = re.compile(r"audit-(\d{12})-(\d{12})\.jsonl\.gz")
_FIELDS: Final = tuple(field.name for field in dataclasses.fields(AuditRecord))


class ArchiveError(ProtocolUsageError):
    """An archived segment cannot be read (damaged, not a segment), or cannot be written."""


class ArchivableAuditLog(AuditLog, Protocol):
    """An audit log whose oldest records can be removed once archived."""

    def last(self) -> AuditRecord | None:
        """The last record."""
        ...

    def remove_through(self, seq: int) -> int:
        """Delete the records up to ``seq``, keeping the last one; how many were deleted."""
        ...


@dataclass(frozen=True, slots=True)
class ArchivedSegment:
    """One segment file and the records it holds (``first``..``last``)."""

    path: Path
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def archived_segments(folder: Path) -> list[ArchivedSegment]:
    """The segments in ``folder``, in ``seq`` order (none when it does not exist)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _NAME.fullmatch(path.name)
        if match:
            found.append(ArchivedSegment(path, int(match[1]), int(match[2])))
    return sorted(found, key=lambda segment: (segment.first, segment.last))


def _read_segment(segment: ArchivedSegment) -> Iterator[AuditRecord]:
    try:
        with gzip.open(segment.path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                try:
                    fields = json.loads(line)
                    yield AuditRecord(*(fields[name] for name in _FIELDS))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ArchiveError(
                        f"archived segment {segment.path} line {number} is not an audit record "
                        f"({type(exc).__name__}): the segment was edited or damaged"
                    ) from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ArchiveError(f"archived segment {segment.path} cannot be read: {exc}") from None


def all_records(log: AuditLog, folder: Path) -> Iterator[AuditRecord]:
    """The archived records in ``folder`` then the live log's, in ``seq`` order.

    A live record of a ``seq`` already archived (a crash between the two steps of
    ``archive_audit``) is skipped when it is the same record (same hash, and its contents still
    match it), yielded when it differs, so verification names it.

    Raises:
        ArchiveError: While iterating, when a segment cannot be read.
    """
    # Only the newest segment can overlap the live log (written, then the process died before
    # the delete): its hashes are kept to recognise the live copies.
    newest: dict[int, str] = {}
    last = 0
    for segment in archived_segments(folder):
        newest = {}
        for record in _read_segment(segment):
            last = max(last, record.seq)
            newest[record.seq] = record.hash
            yield record
    for record in log.records():
        if (
            record.seq <= last
            and newest.get(record.seq) == record.hash
            and record.expected_hash() == record.hash
        ):
            continue
        yield record


def _write_segment(records: Iterable[AuditRecord], folder: Path) -> ArchivedSegment | None:
    """Stream ``records`` into a new segment in ``folder``; ``None`` when there were none."""
    partial = folder / ".audit-segment.partial"
    first = last = 0
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
                for record in records:
                    first = first or record.seq
                    last = record.seq
                    line = json.dumps(dataclasses.asdict(record), ensure_ascii=False)
                    packed.write(line.encode("utf-8") + b"\n")
            raw.flush()
            os.fsync(raw.fileno())
        if not first:
            partial.unlink()
            return None
        segment = ArchivedSegment(folder / f"audit-{first:012d}-{last:012d}.jsonl.gz", first, last)
        os.replace(partial, segment.path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)
    return segment


def archive_audit(
    log: ArchivableAuditLog, folder: Path, *, through_seq: int
) -> ArchivedSegment | None:
    """Move the live records up to ``through_seq`` (never the last one) into a new segment.

    Records stream from the log to the file (a log of any size). Only one archiving process at a
    time per log: ``stratagem audit archive`` is an operator's command, not run by the agents.

    Args:
        log: The live log.
        folder: Where segments are kept (created private when missing).
        through_seq: The last ``seq`` to archive.

    Returns:
        The segment written, or ``None`` when nothing was old enough to move.

    Raises:
        ArchiveError: When the segment cannot be written (nothing is deleted then).
    """
    last = log.last()
    if last is None:
        return None
    through = min(through_seq, last.seq - 1)
    records = itertools.takewhile(lambda record: record.seq <= through, log.records())
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        segment = _write_segment(records, folder)
    except OSError as exc:
        raise ArchiveError(f"cannot write an audit segment in {folder}: {exc}") from None
    if segment is not None:
        log.remove_through(segment.last)
    return segment
