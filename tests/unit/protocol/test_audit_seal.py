"""Signed audit heads: sealing, the key file, and every tamper case named by ``verify_sealed``."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratagem.protocol import (
    AuditRecord,
    InMemoryAuditLog,
    ProtocolUsageError,
    SqliteAuditLog,
    digest,
)
from stratagem.protocol._audit import (
    GENESIS,
    KEY_BYTES,
    AuditSealer,
    SealableAuditLog,
    SignedHead,
    load_or_create_key,
    verify_chain,
    verify_sealed,
)

KEY = b"k" * 32
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _append(log: InMemoryAuditLog | SqliteAuditLog, index: int, actor: str = "operator") -> None:
    log.append(
        actor=actor,
        action="call.outcome",
        target="perception",
        capability="ExtractEntities",
        request_id=f"req-{actor}-{index}",
        code="OK",
        detail=f"answer {index}",
        digest=digest(f"payload {index}".encode()),
    )


def _fill_and_seal(
    log: InMemoryAuditLog | SqliteAuditLog, sealer: AuditSealer, count: int, clock: FakeClock
) -> None:
    for index in range(count):
        _append(log, index)
        clock.now += 1.0
        sealer.maybe_seal()


def _head_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _signed_at(heads: Path, seq: int) -> str:
    [line] = [line for line in _head_lines(heads) if line["seq"] == seq]
    return str(line["sealed_at"])


# --- SQLite: a log of 30 records sealed at 10, 20 and 30 ---------------------------------------


@dataclass
class Sealed:
    db: Path
    heads: Path

    def verdict(self, key: bytes = KEY) -> tuple[bool, int | None, str]:
        with SqliteAuditLog(self.db) as log:
            verdict = verify_sealed(log.records(), self.heads, key)
        return verdict.ok, verdict.first_broken_seq, verdict.reason

    def chain_alone_is_ok(self) -> bool:
        with SqliteAuditLog(self.db) as log:
            return verify_chain(log.records()).ok


@pytest.fixture
def sealed(tmp_path: Path) -> Sealed:
    db, heads = tmp_path / "state" / "audit.db", tmp_path / "state" / "audit.heads"
    clock = FakeClock()
    with SqliteAuditLog(db) as log:
        sealer = AuditSealer(log, KEY, heads, every_records=10, every_s=3600, clock=clock)
        _fill_and_seal(log, sealer, 30, clock)
    assert [line["seq"] for line in _head_lines(heads)] == [10, 20, 30]
    return Sealed(db, heads)


def _tamper(path: Path, *statements: str) -> None:
    """Change the database behind the log's back, as someone with write access to it could."""
    db = sqlite3.connect(path)
    try:
        db.execute("DROP TRIGGER IF EXISTS audit_no_update")
        db.execute("DROP TRIGGER IF EXISTS audit_no_delete")
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()


def _rechain(path: Path, *, renumber: bool = False) -> None:
    """Recompute every seq, prev_hash and hash, as an attacker who knows the formula can."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT * FROM audit ORDER BY seq").fetchall()
        db.execute("DROP TRIGGER IF EXISTS audit_no_update")
        db.execute("DROP TRIGGER IF EXISTS audit_no_delete")
        db.execute("DELETE FROM audit")
        prev_hash = GENESIS
        for index, row in enumerate(rows, start=1):
            record = AuditRecord(*row)
            record = dataclasses.replace(
                record, seq=index if renumber else record.seq, prev_hash=prev_hash
            )
            record = dataclasses.replace(record, hash=record.expected_hash())
            prev_hash = record.hash
            db.execute(
                f"INSERT INTO audit VALUES ({', '.join('?' * 12)})", dataclasses.astuple(record)
            )
        db.commit()
    finally:
        db.close()


def test_a_sealed_log_verifies_and_counts_its_heads(sealed: Sealed) -> None:
    with SqliteAuditLog(sealed.db) as log:
        verdict = verify_sealed(log.records(), sealed.heads, KEY)
    assert (verdict.ok, verdict.count, verdict.sealed) == (True, 30, 3)
    assert stat.S_IMODE(sealed.heads.stat().st_mode) == 0o600
    first = _head_lines(sealed.heads)[0]
    assert set(first) == {"seq", "hash", "sealed_at", "mac"}
    assert first["sealed_at"] == "2026-01-01T00:00:10.000000+00:00"


def test_an_edited_record_is_named(sealed: Sealed) -> None:
    _tamper(sealed.db, "UPDATE audit SET detail = 'nothing happened' WHERE seq = 14")
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 14)
    assert reason == "record 14 was edited: its hash does not match its contents"


def test_a_deleted_record_is_named_as_missing(sealed: Sealed) -> None:
    _tamper(sealed.db, "DELETE FROM audit WHERE seq = 14")
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 14)
    assert reason == "record 14 is missing: seq 15 follows seq 13 (deleted)"


def test_a_reordered_pair_is_named(sealed: Sealed) -> None:
    _tamper(
        sealed.db,
        "UPDATE audit SET seq = -1 WHERE seq = 14",
        "UPDATE audit SET seq = 14 WHERE seq = 15",
        "UPDATE audit SET seq = 15 WHERE seq = -1",
    )
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 14)
    assert reason == "record 14 is the record written as seq 15: records 14 and 15 were reordered"


def test_a_truncated_tail_is_named_though_the_chain_left_is_intact(sealed: Sealed) -> None:
    _tamper(sealed.db, "DELETE FROM audit WHERE seq > 25")
    assert sealed.chain_alone_is_ok()
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 26)
    assert reason == (
        f"truncated: record 30 (signed at {_signed_at(sealed.heads, 30)}) is missing; "
        "the log ends at seq 25"
    )


def test_a_truncated_tail_is_named_when_the_rest_is_rewritten_and_rechained(
    sealed: Sealed,
) -> None:
    _tamper(
        sealed.db,
        "DELETE FROM audit WHERE seq > 25",
        "UPDATE audit SET code = 'PERMISSION_DENIED' WHERE seq = 22",
    )
    _rechain(sealed.db)
    assert sealed.chain_alone_is_ok()
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 26)
    assert reason.startswith("truncated: record 30 (signed at ")


def test_a_recomputed_chain_with_an_edited_record_is_caught_by_the_heads(sealed: Sealed) -> None:
    _tamper(sealed.db, "UPDATE audit SET actor = 'nobody' WHERE seq = 14")
    _rechain(sealed.db)
    assert sealed.chain_alone_is_ok()
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 11)
    assert reason == (
        f"the chain was rewritten: record 20 (signed at {_signed_at(sealed.heads, 20)}, heads "
        "line 2) has another hash; the first changed record is between records 11 and 20"
    )


def test_a_deleted_and_renumbered_record_is_caught_by_the_heads(sealed: Sealed) -> None:
    _tamper(sealed.db, "DELETE FROM audit WHERE seq = 4")
    _rechain(sealed.db, renumber=True)
    assert sealed.chain_alone_is_ok()
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 1)
    assert "the chain was rewritten: record 10 " in reason
    assert reason.endswith("between records 1 and 10")


def test_an_edited_heads_file_is_named_by_line(sealed: Sealed) -> None:
    lines = sealed.heads.read_text().splitlines()
    forged = json.loads(lines[1])
    forged["seq"] = 19
    lines[1] = json.dumps(forged)
    sealed.heads.write_text("\n".join(lines) + "\n")
    with SqliteAuditLog(sealed.db) as log:
        verdict = verify_sealed(log.records(), sealed.heads, KEY)
    assert (verdict.ok, verdict.heads_line, verdict.sealed) == (False, 2, 2)
    assert verdict.reason == "signed head line 2 does not verify: the heads file was edited"


def test_a_head_signed_with_another_key_does_not_verify(sealed: Sealed) -> None:
    ok, _, reason = sealed.verdict(key=b"x" * 32)
    assert not ok
    assert reason == "signed head line 1 does not verify: the heads file was edited"


def test_a_deleted_heads_file_fails_verification(sealed: Sealed) -> None:
    sealed.heads.unlink()
    ok, seq, reason = sealed.verdict()
    assert (ok, seq) == (False, 1)
    assert "is missing: no signed head vouches for records 1..30" in reason


def test_records_removed_after_the_last_seal_go_unnoticed(sealed: Sealed) -> None:
    """The documented limit: nothing signed vouches for records after the last seal."""
    with SqliteAuditLog(sealed.db) as log:
        for index in range(5):
            _append(log, 100 + index)
    _tamper(sealed.db, "DELETE FROM audit WHERE seq > 30")
    assert sealed.verdict() == (True, None, "")


# --- the sealer ---------------------------------------------------------------------------------


def test_seal_signs_only_something_new() -> None:
    log = InMemoryAuditLog()
    assert isinstance(log, SealableAuditLog)
    heads = Path(os.devnull)  # never written: nothing to seal
    sealer = AuditSealer(log, KEY, heads)
    assert sealer.seal() is None  # an empty log


def test_seal_writes_one_verifiable_line_per_new_head(tmp_path: Path) -> None:
    log, heads = InMemoryAuditLog(), tmp_path / "audit.heads"
    sealer = AuditSealer(log, KEY, heads, clock=FakeClock())
    _append(log, 0)
    head = sealer.seal()
    assert head is not None
    assert (head.seq, head.hash) == (1, log.head())
    assert head.verifies(KEY)
    assert not head.verifies(b"x" * 32)
    assert not dataclasses.replace(head, seq=2).verifies(KEY)
    assert sealer.seal() is None  # nothing new
    _append(log, 1)
    assert sealer.seal() is not None
    assert heads.read_bytes().count(b"\n") == 2
    assert verify_sealed(log.records(), heads, KEY).sealed == 2


def test_maybe_seal_waits_for_enough_records_or_time(tmp_path: Path) -> None:
    log, heads, clock = InMemoryAuditLog(), tmp_path / "audit.heads", FakeClock()
    sealer = AuditSealer(log, KEY, heads, every_records=5, every_s=10.0, clock=clock)
    sealed = []
    for index in range(12):
        _append(log, index)
        sealed.append(sealer.maybe_seal())
    assert [head.seq for head in sealed if head is not None] == [5, 10]
    clock.now += 9.9
    assert sealer.maybe_seal(appended=0) is None
    clock.now += 0.1
    head = sealer.maybe_seal(appended=0)
    assert head is not None
    assert head.seq == 12
    clock.now += 10
    assert sealer.maybe_seal(appended=0) is None  # the time has come, but nothing is new
    assert [line["seq"] for line in _head_lines(heads)] == [5, 10, 12]


def test_a_restarted_sealer_does_not_sign_the_same_head_again(tmp_path: Path) -> None:
    log, heads = InMemoryAuditLog(), tmp_path / "audit.heads"
    _append(log, 0)
    assert AuditSealer(log, KEY, heads).seal() is not None
    assert AuditSealer(log, KEY, heads).seal() is None


def test_a_forged_far_ahead_head_does_not_stop_sealing(tmp_path: Path) -> None:
    log, heads = InMemoryAuditLog(), tmp_path / "audit.heads"
    forged = SignedHead(10**9, "f" * 64, "2026-01-01T00:00:00.000000+00:00", "0" * 64)
    heads.write_bytes(forged.line())
    _append(log, 0)
    assert AuditSealer(log, KEY, heads).seal() is not None


class _RecordsOnlyLog:
    """An ``AuditLog`` without ``last()``: the sealer walks its records."""

    def __init__(self) -> None:
        self._log = InMemoryAuditLog()

    def append(self, **fields: str) -> AuditRecord:
        return self._log.append(**fields)

    def records(self) -> Iterator[AuditRecord]:
        return self._log.records()

    def head(self) -> str:
        return self._log.head()


def test_a_log_without_last_is_sealed_by_walking_it(tmp_path: Path) -> None:
    log, heads = _RecordsOnlyLog(), tmp_path / "audit.heads"
    assert not isinstance(log, SealableAuditLog)
    for index in range(3):
        log.append(actor="operator", action="call.outcome", detail=str(index))
    head = AuditSealer(log, KEY, heads).seal()
    assert head is not None
    assert (head.seq, head.hash) == (3, log.head())


def test_a_short_key_or_bad_threshold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProtocolUsageError, match="at least 16 bytes"):
        AuditSealer(InMemoryAuditLog(), b"short", tmp_path / "h")
    with pytest.raises(ProtocolUsageError, match="positive"):
        AuditSealer(InMemoryAuditLog(), KEY, tmp_path / "h", every_records=0)


# --- in memory: the same checks on any AuditLog -------------------------------------------------


@pytest.fixture
def memory(tmp_path: Path) -> tuple[list[AuditRecord], Path]:
    log, heads, clock = InMemoryAuditLog(), tmp_path / "audit.heads", FakeClock()
    sealer = AuditSealer(log, KEY, heads, every_records=4, every_s=3600, clock=clock)
    _fill_and_seal(log, sealer, 12, clock)
    return list(log.records()), heads


def test_in_memory_reordered_records_are_named(memory: tuple[list[AuditRecord], Path]) -> None:
    records, heads = memory
    records[5], records[6] = records[6], records[5]
    verdict = verify_sealed(records, heads, KEY)
    assert (verdict.ok, verdict.first_broken_seq, verdict.sealed) == (False, 6, 1)
    assert (
        verdict.reason
        == "record 6 comes after record 7: records were reordered (seq 7 follows seq 5)"
    )


def test_in_memory_deleted_records_are_named(memory: tuple[list[AuditRecord], Path]) -> None:
    records, heads = memory
    del records[5:7]
    verdict = verify_sealed(records, heads, KEY)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 6)
    assert verdict.reason == "records 6..7 are missing: seq 8 follows seq 5 (deleted)"


def test_in_memory_a_rehashed_record_breaks_the_next_link(
    memory: tuple[list[AuditRecord], Path],
) -> None:
    records, heads = memory
    forged = dataclasses.replace(records[5], code="PERMISSION_DENIED")
    records[5] = dataclasses.replace(forged, hash=forged.expected_hash())
    verdict = verify_sealed(records, heads, KEY)
    assert (verdict.ok, verdict.first_broken_seq) == (False, 7)
    assert verdict.reason.startswith("record 7 does not link to record 6: its prev_hash")


def test_in_memory_truncation_is_named(memory: tuple[list[AuditRecord], Path]) -> None:
    records, heads = memory
    verdict = verify_sealed(records[:6], heads, KEY)
    assert (verdict.ok, verdict.first_broken_seq, verdict.sealed) == (False, 7, 1)
    assert verdict.reason.startswith("truncated: record 8 (signed at 2026-01-01T00:00:08.000000")
    assert verify_sealed([], heads, KEY).first_broken_seq == 1


# --- several processes seal one log into one heads file -----------------------------------------


def _append_and_seal(db: str, heads: str, actor: str) -> None:
    with SqliteAuditLog(db) as log:
        sealer = AuditSealer(log, KEY, Path(heads), every_records=3)
        for index in range(60):
            _append(log, index, actor)
            sealer.maybe_seal()
        sealer.seal()


def test_processes_sealing_one_log_write_whole_lines(tmp_path: Path) -> None:
    db, heads = tmp_path / "audit.db", tmp_path / "audit.heads"
    SqliteAuditLog(db).close()
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_append_and_seal, args=(str(db), str(heads), f"p{i}"))
        for i in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=90)
        assert process.exitcode == 0
    lines = heads.read_bytes().split(b"\n")
    assert lines.pop() == b""
    parsed = [SignedHead(**json.loads(line)) for line in lines]
    assert all(head.verifies(KEY) for head in parsed)
    assert len(parsed) >= 40  # each process seals at least every 3 of its 60 records
    assert max(head.seq for head in parsed) == 120
    with SqliteAuditLog(db) as log:
        verdict = verify_sealed(log.records(), heads, KEY)
    assert (verdict.ok, verdict.count, verdict.sealed) == (True, 120, len(parsed))


# --- the key file -------------------------------------------------------------------------------


def test_the_key_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "state" / "audit.key"
    key = load_or_create_key(path)
    assert len(key) == KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(path) == key
    assert [p.name for p in path.parent.iterdir()] == ["audit.key"]  # no temporary file left


def test_racing_creators_share_one_key(tmp_path: Path) -> None:
    path = tmp_path / "audit.key"
    keys: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: keys.append(load_or_create_key(path))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8
    assert len(set(keys)) == 1


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660], ids=oct)
def test_a_key_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "audit.key"
    load_or_create_key(path)
    path.chmod(mode)
    with pytest.raises(ProtocolUsageError, match=r"has mode 0\d{3}.*chmod 600"):
        load_or_create_key(path)


def test_a_key_of_another_length_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"too short")
    os.close(fd)
    with pytest.raises(ProtocolUsageError, match="holds 9 bytes, not 32"):
        load_or_create_key(path)


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "real.key"
    load_or_create_key(target)
    link = tmp_path / "audit.key"
    link.symlink_to(target)
    with pytest.raises(ProtocolUsageError, match="cannot read"):
        load_or_create_key(link)


def test_mirrored_heads_read_the_copys_extra_lines_and_survive_a_failing_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from stratagem.protocol import FileHeads, MirroredHeads

    primary, copy = FileHeads(tmp_path / "a.heads"), FileHeads(tmp_path / "b.heads")
    mirrored = MirroredHeads(primary, copy)
    assert mirrored.read() is None
    mirrored.append(b'{"one":1}\n')
    mirrored.append(b'{"two":2}\n')
    (tmp_path / "a.heads").write_bytes(b'{"one":1}\n')  # the primary's last line cut
    assert mirrored.read() == b'{"one":1}\n{"two":2}\n'
    assert mirrored.tail() == b'{"one":1}\n'
    broken = MirroredHeads(primary, FileHeads(tmp_path / "missing" / "c.heads"))
    broken.append(b'{"three":3}\n')
    assert primary.read() == b'{"one":1}\n{"three":3}\n'
    assert "cannot copy a signed audit head" in caplog.text
