"""Audit retention: archived segments, and one chain verified across them and the live log."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from stratagem.protocol import (
    ArchiveError,
    AuditSealer,
    PostgresAuditLog,
    SqliteAuditLog,
    all_records,
    archive_audit,
    archived_segments,
    verify_chain,
    verify_sealed,
)
from stratagem.protocol._audit._archive import _write_segment
from tests.unit.protocol.test_audit import _fill

KEY = b"k" * 32
Log = SqliteAuditLog | PostgresAuditLog


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_log(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Log]:
    if request.param == "sqlite":
        return lambda: SqliteAuditLog(tmp_path / "audit.db")
    url: str = request.getfixturevalue("postgres_url")
    return lambda: PostgresAuditLog(url, schema="stratagem")


def _sealed_log(open_log: Callable[[], Log], heads: Path, count: int) -> Log:
    log = open_log()
    sealer = AuditSealer(log, KEY, heads, every_records=10, every_s=3600)
    for _ in range(count // 10):
        _fill(log, 10)
        sealer.maybe_seal(10)
    return log


def test_archived_records_leave_the_live_log_and_the_chain_verifies_across_segments(
    open_log: Callable[[], Log], tmp_path: Path
) -> None:
    heads, folder = tmp_path / "audit.heads", tmp_path / "archive"
    log = _sealed_log(open_log, heads, 50)
    first = archive_audit(log, folder, through_seq=20)
    second = archive_audit(log, folder, through_seq=35)
    assert first is not None
    assert second is not None
    assert [(s.first, s.last) for s in archived_segments(folder)] == [(1, 20), (21, 35)]
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert [r.seq for r in log.records()] == list(range(36, 51))
    _fill(log, 5)  # new records chain on from the live log
    verdict = verify_sealed(all_records(log, folder), heads, KEY)
    assert (verdict.ok, verdict.count, verdict.sealed) == (True, 55, 5)
    # The live log alone starts at 36: it does not verify without its archive.
    assert not verify_chain(log.records()).ok
    log.close()


def test_the_newest_record_always_stays_live(open_log: Callable[[], Log], tmp_path: Path) -> None:
    log = open_log()
    assert archive_audit(log, tmp_path / "archive", through_seq=10) is None  # an empty log
    _fill(log, 3)
    segment = archive_audit(log, tmp_path / "archive", through_seq=1_000)
    assert segment is not None
    assert (segment.first, segment.last) == (1, 2)
    assert [r.seq for r in log.records()] == [3]
    assert archive_audit(log, tmp_path / "archive", through_seq=1_000) is None
    _fill(log, 1)
    assert verify_chain(all_records(log, tmp_path / "archive")).count == 4
    log.close()


def test_a_deleted_segment_fails_verification_naming_the_missing_records(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "archive"
    log = _sealed_log(lambda: SqliteAuditLog(tmp_path / "audit.db"), tmp_path / "heads", 30)
    first = archive_audit(log, folder, through_seq=10)
    archive_audit(log, folder, through_seq=20)
    assert first is not None
    first.path.unlink()
    verdict = verify_sealed(all_records(log, folder), tmp_path / "heads", KEY)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 1)
    assert "records 1..10 are missing" in verdict.reason
    log.close()


def test_an_edited_segment_fails_verification_naming_the_record(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    log = _sealed_log(lambda: SqliteAuditLog(tmp_path / "audit.db"), tmp_path / "heads", 20)
    segment = archive_audit(log, folder, through_seq=15)
    assert segment is not None
    lines = gzip.decompress(segment.path.read_bytes()).decode().splitlines()
    record = json.loads(lines[6])
    record["actor"] = "someone-else"
    lines[6] = json.dumps(record)
    segment.path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    verdict = verify_sealed(all_records(log, folder), tmp_path / "heads", KEY)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 7)
    log.close()


def test_a_damaged_segment_is_one_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    log = SqliteAuditLog(tmp_path / "audit.db")
    _fill(log, 5)
    segment = archive_audit(log, folder, through_seq=3)
    assert segment is not None
    segment.path.write_bytes(b"not gzip at all")
    with pytest.raises(ArchiveError, match=r"audit-000000000001-000000000003\.jsonl\.gz"):
        list(all_records(log, folder))
    segment.path.write_bytes(gzip.compress(b'{"seq": 1}\n'))
    with pytest.raises(ArchiveError, match="line 1 is not an audit record"):
        list(all_records(log, folder))
    log.close()


def test_a_crash_between_writing_the_segment_and_deleting_reads_each_record_once(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "archive"
    log = SqliteAuditLog(tmp_path / "audit.db")
    _fill(log, 10)
    folder.mkdir()
    # The segment was written and renamed, then the process died before the delete.
    segment = _write_segment((r for r in log.records() if r.seq <= 6), folder)
    assert segment is not None
    assert verify_chain(all_records(log, folder)).count == 10
    # A live copy that differs from its archived one is kept, so verification names it.
    log.close()
    db = sqlite3.connect(tmp_path / "audit.db")
    db.execute("DROP TRIGGER audit_no_update")
    db.execute("UPDATE audit SET detail = 'changed' WHERE seq = 4")
    db.commit()
    db.close()
    with SqliteAuditLog(tmp_path / "audit.db") as log:
        verdict = verify_chain(all_records(log, folder))
        assert (verdict.ok, verdict.first_broken_seq) == (False, 4)


def test_a_failed_segment_write_deletes_nothing(tmp_path: Path) -> None:
    log = SqliteAuditLog(tmp_path / "audit.db")
    _fill(log, 5)
    blocked = tmp_path / "archive"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(ArchiveError, match="cannot write an audit segment"):
        archive_audit(log, blocked, through_seq=4)
    assert [r.seq for r in log.records()] == [1, 2, 3, 4, 5]
    log.close()


def test_records_keep_every_field_through_a_segment(tmp_path: Path) -> None:
    log = SqliteAuditLog(tmp_path / "audit.db")
    _fill(log, 4)
    before = list(log.records())
    archive_audit(log, tmp_path / "a", through_seq=3)
    after = list(all_records(log, tmp_path / "a"))
    assert [dataclasses.astuple(r) for r in after] == [dataclasses.astuple(r) for r in before]
    log.close()
