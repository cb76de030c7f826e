"""The audit log: the chain formula, redaction, and tamper detection in memory and in SQLite."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from protocol import (
    AuditRecord,
    InMemoryAuditLog,
    ProtocolUsageError,
    SqliteAuditLog,
    digest,
    verify_chain,
)
from protocol._audit import GENESIS, redact


def _fill(log: InMemoryAuditLog | SqliteAuditLog, count: int, actor: str = "operator") -> None:
    for index in range(count):
        log.append(
            actor=actor,
            action="call.outcome",
            target="perception",
            capability="ExtractEntities",
            request_id=f"req-{index}",
            code="OK",
            detail=f"answer {index}",
            digest=digest(f"payload {index}".encode()),
        )


def test_records_are_chained_by_the_documented_formula() -> None:
    log = InMemoryAuditLog()
    assert log.head() == GENESIS
    first = log.append(actor="operator", action="call.accepted", target="perception")
    second = log.append(actor="operator", action="call.outcome", code="OK")
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == GENESIS
    assert second.prev_hash == first.hash
    assert log.head() == second.hash
    fields = dataclasses.asdict(second)
    del fields["hash"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert second.hash == hashlib.sha256((first.hash + canonical).encode()).hexdigest()
    assert list(log.records()) == [first, second]
    assert verify_chain(log.records()).ok


def test_details_are_redacted_to_one_line() -> None:
    log = InMemoryAuditLog()
    record = log.append(
        actor="op\nerator",
        action="call.outcome",
        detail="failed:\n  password=hunter2 token: abc123\tAuthorization Bearer xyz " + "x" * 500,
    )
    assert record.actor == "op erator"
    for leaked in ("\n", "\t", "hunter2", "abc123", "xyz"):
        assert leaked not in record.detail
    assert record.detail.startswith("failed: password=*** token: *** Authorization ***")
    assert len(record.detail) == 240
    assert redact("short") == "short"


def test_digest_is_sha256_hex() -> None:
    assert digest(b"payload") == hashlib.sha256(b"payload").hexdigest()


def test_an_empty_chain_is_intact() -> None:
    verdict = verify_chain([])
    assert (verdict.ok, verdict.count, verdict.first_broken_seq) == (True, 0, None)


def _chain(count: int) -> list[AuditRecord]:
    log = InMemoryAuditLog()
    _fill(log, count)
    return list(log.records())


def test_an_edited_record_is_named() -> None:
    records = _chain(5)
    records[2] = dataclasses.replace(records[2], code="PERMISSION_DENIED")
    verdict = verify_chain(records)
    assert (verdict.ok, verdict.count, verdict.first_broken_seq) == (False, 2, 3)
    assert "edited" in verdict.reason


def test_an_edited_and_rehashed_record_breaks_the_next_link() -> None:
    records = _chain(5)
    forged = dataclasses.replace(records[2], code="PERMISSION_DENIED")
    records[2] = dataclasses.replace(forged, hash=forged.expected_hash())
    verdict = verify_chain(records)
    assert verdict.first_broken_seq == 4
    assert "prev_hash" in verdict.reason


def test_a_deleted_record_is_detected_at_the_next() -> None:
    records = _chain(5)
    del records[1]
    verdict = verify_chain(records)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 3)
    assert "seq 3 follows seq 1" in verdict.reason


def test_reordered_records_are_detected() -> None:
    records = _chain(5)
    records[1], records[2] = records[2], records[1]
    verdict = verify_chain(records)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 3)


def test_a_cut_tail_shows_against_a_kept_head() -> None:
    log = InMemoryAuditLog()
    _fill(log, 5)
    head = log.head()
    records = list(log.records())[:3]
    assert verify_chain(records).ok
    verdict = verify_chain(records, expected_head=head)
    assert (verdict.ok, verdict.count, verdict.first_broken_seq) == (False, 3, 4)


def test_appends_from_threads_keep_one_chain() -> None:
    log = InMemoryAuditLog()
    threads = [threading.Thread(target=_fill, args=(log, 50, f"t{i}")) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    verdict = verify_chain(log.records())
    assert (verdict.ok, verdict.count) == (True, 200)


# --- SQLite -------------------------------------------------------------------------------------


def _tamper(path: Path, *statements: str) -> None:
    """Change the file behind the log's back, as someone with write access to it could."""
    db = sqlite3.connect(path)
    try:
        db.execute("DROP TRIGGER audit_no_update")
        db.execute("DROP TRIGGER audit_no_delete")
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()


@pytest.fixture
def sqlite_log(tmp_path: Path) -> SqliteAuditLog:
    path = tmp_path / "state" / "audit.db"
    with SqliteAuditLog(path) as log:
        _fill(log, 6)
    return SqliteAuditLog(path)


@pytest.mark.integration
def test_sqlite_log_persists_and_verifies(sqlite_log: SqliteAuditLog) -> None:
    with sqlite_log as log:
        assert log.path.exists()
        records = list(log.records())
        assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
        assert log.head() == records[-1].hash
        log.append(actor="operator", action="call.denied", code="PERMISSION_DENIED")
        verdict = verify_chain(log.records(), expected_head=log.head())
        assert (verdict.ok, verdict.count) == (True, 7)
        mode = log._db.execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


@pytest.mark.integration
def test_sqlite_log_refuses_updates_and_deletes(sqlite_log: SqliteAuditLog) -> None:
    sqlite_log.close()
    db = sqlite3.connect(sqlite_log.path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("UPDATE audit SET code = 'OK' WHERE seq = 2")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("DELETE FROM audit WHERE seq = 2")
    finally:
        db.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("statements", "broken", "reason"),
    [
        (["UPDATE audit SET detail = 'nothing happened' WHERE seq = 3"], 3, "edited"),
        (["DELETE FROM audit WHERE seq = 3"], 4, "seq 4 follows seq 2"),
        (
            [
                "UPDATE audit SET seq = -1 WHERE seq = 3",
                "UPDATE audit SET seq = 3 WHERE seq = 4",
                "UPDATE audit SET seq = 4 WHERE seq = -1",
            ],
            3,
            "edited",
        ),
    ],
    ids=["edit", "delete", "swap"],
)
def test_sqlite_tampering_is_named(
    sqlite_log: SqliteAuditLog, statements: list[str], broken: int, reason: str
) -> None:
    sqlite_log.close()
    _tamper(sqlite_log.path, *statements)
    with SqliteAuditLog(sqlite_log.path) as log:
        verdict = verify_chain(log.records())
    assert (verdict.ok, verdict.first_broken_seq) == (False, broken)
    assert reason in verdict.reason


@pytest.mark.integration
def test_sqlite_log_refuses_another_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    SqliteAuditLog(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(ProtocolUsageError, match="schema version 99"):
        SqliteAuditLog(path)


@pytest.mark.integration
def test_sqlite_logs_on_one_file_share_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    logs = [SqliteAuditLog(path) for _ in range(3)]
    threads = [
        threading.Thread(target=_fill, args=(log, 30, f"t{i}")) for i, log in enumerate(logs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    verdict = verify_chain(logs[0].records())
    assert (verdict.ok, verdict.count) == (True, 90)
    for log in logs:
        log.close()


def _append_from_process(path: str, actor: str) -> None:
    with SqliteAuditLog(path) as log:
        _fill(log, 25, actor)


@pytest.mark.integration
def test_sqlite_log_is_safe_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    SqliteAuditLog(path).close()
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_append_from_process, args=(str(path), f"p{i}")) for i in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    with SqliteAuditLog(path) as log:
        records = list(log.records())
    assert verify_chain(records).ok
    assert len(records) == 75
    assert {r.actor for r in records} == {"p0", "p1", "p2"}
