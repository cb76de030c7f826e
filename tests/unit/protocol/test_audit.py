"""The audit log: the chain formula, redaction, and tamper detection in memory, in SQLite and in
PostgreSQL (with concurrent writers from several processes)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import multiprocessing
import re
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratagem.protocol import (
    AuditRecord,
    InMemoryAuditLog,
    PostgresAuditLog,
    ProtocolUsageError,
    SqliteAuditLog,
    StorageError,
    digest,
    verify_chain,
)
from stratagem.protocol._audit import GENESIS, AsyncAuditLog, Synchronous, redact

Log = InMemoryAuditLog | SqliteAuditLog | PostgresAuditLog


def _fill(log: Log, count: int, actor: str = "operator") -> None:
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


def test_sqlite_log_refuses_another_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    SqliteAuditLog(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(ProtocolUsageError, match="schema version 99"):
        SqliteAuditLog(path)


OpenLog = Callable[[], SqliteAuditLog | PostgresAuditLog]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> OpenLog:
    """``durable()``: a durable log, on the same file or schema each time it is called."""
    if request.param == "sqlite":
        return lambda: SqliteAuditLog(tmp_path / "audit.db")
    url: str = request.getfixturevalue("postgres_url")
    return lambda: PostgresAuditLog(url, schema="stratagem")


def test_durable_logs_on_one_store_share_one_chain(durable: OpenLog) -> None:
    logs = [durable() for _ in range(3)]
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


# --- the fast paths compute what the documented formulas do -------------------------------------

_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


def _redacted_the_long_way(text: str, limit: int) -> str:
    secret = re.compile(
        r"(?i)\b(password|passwd|secret|token|api[_-]?key|authorization|bearer|cookie)\b"
        r"(\s*[:=]\s*|\s+)(?:(?:bearer|basic)\s+)?\S+"
    )
    line = secret.sub(lambda match: f"{match.group(1)}{match.group(2)}***", " ".join(text.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        _TEXT,
        st.from_regex(r"(token|password|api_key)[:= \u2028\x1c]{1,3}\w+ ?", fullmatch=True),
    ),
    limit=st.sampled_from([8, 128, 240]),
)
def test_redaction_shortcut_changes_nothing(text: str, limit: int) -> None:
    assert redact(text, limit) == _redacted_the_long_way(text, limit)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(_TEXT, min_size=9, max_size=9), seq=st.integers(1, 2**62))
def test_the_chain_hash_is_the_documented_formula(texts: list[str], seq: int) -> None:
    ts, actor, action, target, capability, request_id, code, detail, payload = texts
    record = AuditRecord(
        seq, ts, actor, action, target, capability, request_id, code, detail, payload, GENESIS, ""
    )
    fields = dataclasses.asdict(record)
    del fields["hash"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert record.expected_hash() == hashlib.sha256((GENESIS + canonical).encode()).hexdigest()


def test_a_record_forged_with_other_types_is_hashed_by_the_formula() -> None:
    record = AuditRecord(1, "t", "a", "b", "c", "d", "e", "f", "g", "h", GENESIS, "")
    forged = dataclasses.replace(record, code=None)  # type: ignore[arg-type]
    fields = dataclasses.asdict(forged)
    del fields["hash"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert forged.expected_hash() == hashlib.sha256((GENESIS + canonical).encode()).hexdigest()


# --- async appends ------------------------------------------------------------------------------


async def test_in_memory_append_async_appends_on_the_spot() -> None:
    log = InMemoryAuditLog()
    pending = log.append_async(actor="operator", action="call.accepted", detail="a\nb")
    assert list(log.records()) == []  # nothing happens before the await...
    record = await pending
    assert list(log.records()) == [record]  # ...and the await never suspends
    assert record.detail == "a b"
    assert isinstance(log, AsyncAuditLog)


async def test_group_commit_keeps_one_chain_across_writers(durable: OpenLog) -> None:
    with durable() as log, durable() as other:
        writer = threading.Thread(target=_fill, args=(other, 40, "thread"))
        writer.start()
        records = await asyncio.gather(
            *(
                log.append_async(actor="loop", action="call.accepted", request_id=f"r{i}")
                for i in range(300)
            )
        )
        writer.join()
        assert [r.request_id for r in records] == [f"r{i}" for i in range(300)]
        stored = list(log.records())
    verdict = verify_chain(stored, expected_head=stored[-1].hash)
    assert (verdict.ok, verdict.count) == (True, 340)
    assert {r.seq for r in records} <= {r.seq for r in stored}
    assert [r for r in stored if r.actor == "loop"] == records


async def test_a_failed_group_commit_fails_its_callers(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    with SqliteAuditLog(path) as log:
        db = sqlite3.connect(path)
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit WHEN NEW.actor = 'mallory' "
            "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        db.commit()
        db.close()
        with pytest.raises(StorageError, match="disk says no") as info:
            await log.append_async(actor="mallory", action="call.accepted")
        assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
        record = await log.append_async(actor="operator", action="call.accepted")
        assert [r.seq for r in log.records()] == [record.seq] == [1]


async def test_close_writes_what_was_handed_over(durable: OpenLog) -> None:
    log = durable()
    pending = [log.append_async(actor="operator", action="call.outcome") for _ in range(50)]
    log.close()
    assert len(await asyncio.gather(*pending)) == 50
    with pytest.raises(ProtocolUsageError, match="closed"):
        log.append_async(actor="operator", action="call.outcome")
    with durable() as reopened:
        assert verify_chain(reopened.records()).count == 50


async def test_a_loop_turns_records_commit_together_on_the_loop(tmp_path: Path) -> None:
    with SqliteAuditLog(tmp_path / "audit.db") as log:
        records = await asyncio.gather(
            *(
                log.append_async(actor="loop", action="call.accepted", request_id=f"r{i}")
                for i in range(100)
            )
        )
        assert [r.seq for r in records] == list(range(1, 101))
        assert log._loop_commits == 1  # one transaction for the hundred
        assert log._writer is None  # and no thread was needed
        assert verify_chain(log.records()).count == 100


async def test_a_held_record_commits_with_the_next_record_not_held(tmp_path: Path) -> None:
    with SqliteAuditLog(tmp_path / "audit.db") as log:
        held = log.append_held(actor="loop", action="call.accepted", request_id="r1")
        for _ in range(5):  # turns of the loop, well within the hold time: nothing commits
            await asyncio.sleep(0)
        assert not held.done()
        assert log._loop_commits == 0
        outcome = await log.append_async(actor="loop", action="call.outcome", request_id="r1")
        assert held.done()
        assert log._loop_commits == 1  # one transaction for both, in the order appended
        assert ((await held).seq, outcome.seq) == (1, 2)
        assert verify_chain(log.records()).count == 2


async def test_a_held_record_alone_commits_within_the_hold_time(tmp_path: Path) -> None:
    from stratagem.protocol._audit._sqlite import HOLD_S

    with SqliteAuditLog(tmp_path / "audit.db") as log:
        started = asyncio.get_running_loop().time()
        record = await asyncio.wait_for(
            log.append_held(actor="loop", action="call.accepted", request_id="long"), 5
        )
        assert asyncio.get_running_loop().time() - started >= HOLD_S * 0.9
        assert (record.seq, log._loop_commits) == (1, 1)
        # Held records appended while nothing else is, share the one timer and commit together.
        pending = [
            log.append_held(actor="loop", action="call.accepted", request_id=f"h{i}")
            for i in range(3)
        ]
        assert [r.seq for r in await asyncio.gather(*pending)] == [2, 3, 4]
        assert log._loop_commits == 2


async def test_held_records_are_written_when_the_log_closes(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    log = SqliteAuditLog(path)
    held = log.append_held(actor="loop", action="call.accepted", request_id="closing")
    log.close()
    assert (await held).request_id == "closing"
    with SqliteAuditLog(path) as reopened:
        assert [r.request_id for r in reopened.records()] == ["closing"]


async def test_a_held_record_of_a_full_sync_log_goes_to_the_writer(tmp_path: Path) -> None:
    with SqliteAuditLog(tmp_path / "audit.db", synchronous="full") as log:
        record = await asyncio.wait_for(
            log.append_held(actor="loop", action="call.accepted", request_id="fsynced"), 30
        )
        assert record.seq == 1
        assert log._writer is not None


async def test_a_busy_write_lock_sends_the_batch_to_the_writer_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.db"
    with SqliteAuditLog(path) as log:
        await log.append_async(actor="loop", action="call.accepted", request_id="first")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process is writing
        try:
            pending = log.append_async(actor="loop", action="call.accepted", request_id="second")
            started = asyncio.get_running_loop().time()
            await asyncio.sleep(0.2)
            assert asyncio.get_running_loop().time() - started < 5  # the loop kept running
            assert not pending.done()  # the record waits for the lock, in the writer thread
            assert log._writer is not None
        finally:
            other.execute("COMMIT")
            other.close()
        record = await asyncio.wait_for(pending, 30)
        assert (record.seq, record.request_id) == (2, "second")
        assert verify_chain(log.records()).ok


async def test_the_writer_checkpoints_the_loops_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stratagem.protocol._audit import _sqlite as _audit

    monkeypatch.setattr(_audit, "_CHECKPOINT_EVERY", 5)
    with SqliteAuditLog(tmp_path / "audit.db") as log:
        done = threading.Event()
        runs: list[int] = []
        checkpoint = log._checkpoint

        def counted() -> None:
            checkpoint()
            runs.append(1)
            if len(runs) == 2:
                done.set()

        monkeypatch.setattr(log, "_checkpoint", counted)
        for index in range(10):  # ten turns, ten commits
            await log.append_async(actor="loop", action="call.accepted", request_id=f"r{index}")
        assert await asyncio.to_thread(done.wait, 30)
        assert len(runs) == 2
        # Everything committed on the loop's connection is in the database file after the
        # checkpoint (the WAL was moved into it): a fresh reader sees all ten.
        assert verify_chain(log.records()).count == 10


def _append_then_die(path: str, ready: multiprocessing.synchronize.Event) -> None:
    async def main() -> None:
        log = SqliteAuditLog(path)
        await log.append_async(actor="operator", action="call.outcome", request_id="seen")
        ready.set()  # the caller could act on the answer now
        await asyncio.sleep(60)

    asyncio.run(main())


def test_a_record_the_caller_saw_committed_survives_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    process = context.Process(target=_append_then_die, args=(str(path), ready))
    process.start()
    try:
        assert ready.wait(60)
    finally:
        process.kill()  # SIGKILL: no close, no flush, no checkpoint
        process.join(30)
    with SqliteAuditLog(path) as reopened:
        records = list(reopened.records())
    assert [r.request_id for r in records] == ["seen"]
    assert verify_chain(records).ok


@pytest.mark.parametrize(("synchronous", "pragma"), [("normal", 1), ("full", 2)])
def test_sqlite_durability_is_configurable(
    tmp_path: Path, synchronous: Synchronous, pragma: int
) -> None:
    with SqliteAuditLog(tmp_path / "audit.db", synchronous=synchronous) as log:
        assert log.synchronous == synchronous
        assert log._db.execute("PRAGMA synchronous").fetchone()[0] == pragma
        assert log._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_durability_must_be_known(tmp_path: Path) -> None:
    with pytest.raises(ProtocolUsageError, match="'normal' or 'full'"):
        SqliteAuditLog(tmp_path / "audit.db", synchronous="sometimes")  # type: ignore[arg-type]
    assert not (tmp_path / "audit.db").exists()


def test_sqlite_defaults_to_normal(tmp_path: Path) -> None:
    with SqliteAuditLog(tmp_path / "audit.db") as log:
        assert log.synchronous == "normal"


# --- PostgreSQL ---------------------------------------------------------------------------------


def _pg_execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


@pytest.fixture
def pg_log(postgres_url: str) -> Callable[[], PostgresAuditLog]:
    """``pg_log()``: a log on the test database's ``audit`` schema, holding 6 records."""
    with PostgresAuditLog(postgres_url, schema="audit") as log:
        _fill(log, 6)
    return lambda: PostgresAuditLog(postgres_url, schema="audit")


@pytest.mark.postgres
def test_postgres_log_persists_and_verifies(pg_log: Callable[[], PostgresAuditLog]) -> None:
    with pg_log() as log:
        records = list(log.records())
        assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
        assert log.head() == records[-1].hash
        assert log.last() == records[-1]
        record = log.append(actor="operator", action="call.denied", code="PERMISSION_DENIED")
        assert (record.seq, record.prev_hash) == (7, records[-1].hash)
        verdict = verify_chain(log.records(), expected_head=log.head())
        assert (verdict.ok, verdict.count) == (True, 7)
    with pytest.raises(ProtocolUsageError, match="closed"):
        log.head()


@pytest.mark.postgres
def test_postgres_log_pages_through_many_records(postgres_url: str) -> None:
    with PostgresAuditLog(postgres_url) as log:
        log._PAGE = 7
        _fill(log, 30)
        assert [r.seq for r in log.records()] == list(range(1, 31))


@pytest.mark.postgres
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit.audit SET code = 'OK' WHERE seq = 2",
        "DELETE FROM audit.audit WHERE seq = 2",
        "TRUNCATE audit.audit",
    ],
    ids=["update", "delete", "truncate"],
)
def test_postgres_log_refuses_updates_and_deletes(
    pg_log: Callable[[], PostgresAuditLog], postgres_url: str, statement: str
) -> None:
    pg_log().close()
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        _pg_execute(postgres_url, statement)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("statements", "broken", "reason"),
    [
        (["UPDATE audit.audit SET detail = 'nothing happened' WHERE seq = 3"], 3, "edited"),
        (["DELETE FROM audit.audit WHERE seq = 3"], 4, "seq 4 follows seq 2"),
        (
            [
                "UPDATE audit.audit SET seq = -1 WHERE seq = 3",
                "UPDATE audit.audit SET seq = 3 WHERE seq = 4",
                "UPDATE audit.audit SET seq = 4 WHERE seq = -1",
            ],
            3,
            "edited",
        ),
    ],
    ids=["edit", "delete", "swap"],
)
def test_postgres_tampering_is_named(
    pg_log: Callable[[], PostgresAuditLog],
    postgres_url: str,
    statements: list[str],
    broken: int,
    reason: str,
) -> None:
    # Someone with the rights to disable the triggers; the chain still tells.
    _pg_execute(
        postgres_url,
        "ALTER TABLE audit.audit DISABLE TRIGGER USER",
        *statements,
        "ALTER TABLE audit.audit ENABLE TRIGGER USER",
    )
    with pg_log() as log:
        verdict = verify_chain(log.records())
    assert (verdict.ok, verdict.first_broken_seq) == (False, broken)
    assert reason in verdict.reason


@pytest.mark.postgres
def test_postgres_log_refuses_another_schema_version(postgres_url: str) -> None:
    PostgresAuditLog(postgres_url).close()
    _pg_execute(
        postgres_url, "UPDATE stratagem.schema_versions SET version = 99 WHERE component = 'audit'"
    )
    with pytest.raises(ProtocolUsageError, match="schema version 99"):
        PostgresAuditLog(postgres_url)


@pytest.mark.postgres
async def test_postgres_failed_group_commit_fails_its_callers(postgres_url: str) -> None:
    with PostgresAuditLog(postgres_url, schema="audit") as log:
        _pg_execute(
            postgres_url,
            """CREATE FUNCTION audit.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF NEW.actor = 'mallory' THEN RAISE EXCEPTION 'disk says no'; END IF;
                RETURN NEW; END $$""",
            "CREATE TRIGGER refuse BEFORE INSERT ON audit.audit "
            "FOR EACH ROW EXECUTE FUNCTION audit.refuse()",
        )
        with pytest.raises(StorageError, match="disk says no") as info:
            await log.append_async(actor="mallory", action="call.accepted")
        assert isinstance(info.value.__cause__, psycopg.errors.RaiseException)
        record = await log.append_async(actor="operator", action="call.accepted")
        assert [r.seq for r in log.records()] == [record.seq] == [1]


def _append_to_postgres(url: str, actor: str, count: int) -> None:
    """One writer process: blocking appends and group commits, on connections of its own."""

    async def grouped(log: PostgresAuditLog) -> None:
        await asyncio.gather(
            *(
                log.append_async(actor=actor, action="call.accepted", request_id=f"{actor}-a{i}")
                for i in range(count)
            )
        )

    with PostgresAuditLog(url) as log, PostgresAuditLog(url) as other:
        writer = threading.Thread(target=_fill, args=(other, count, actor))
        writer.start()
        asyncio.run(grouped(log))
        writer.join()


@pytest.mark.postgres
def test_postgres_writers_in_several_processes_keep_one_chain(postgres_url: str) -> None:
    PostgresAuditLog(postgres_url).close()
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_append_to_postgres, args=(postgres_url, f"p{i}", 40))
        for i in range(4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=90)
        assert process.exitcode == 0
    with PostgresAuditLog(postgres_url) as log:
        records = list(log.records())
        head = log.head()
    verdict = verify_chain(records, expected_head=head)
    assert (verdict.ok, verdict.count) == (True, 4 * 2 * 40)
    assert [r.seq for r in records] == list(range(1, 321))
    for actor in ("p0", "p1", "p2", "p3"):
        mine = [r for r in records if r.actor == actor]
        assert len(mine) == 80
        assert {r.request_id for r in mine if r.action == "call.accepted"} == {
            f"{actor}-a{i}" for i in range(40)
        }


@pytest.mark.postgres
def test_postgres_logs_in_two_schemas_are_two_chains(postgres_url: str) -> None:
    with (
        PostgresAuditLog(postgres_url, schema="one") as one,
        PostgresAuditLog(postgres_url, schema="two") as two,
    ):
        _fill(one, 3)
        _fill(two, 2)
        assert [r.seq for r in one.records()] == [1, 2, 3]
        assert [r.seq for r in two.records()] == [1, 2]
        assert isinstance(one, AsyncAuditLog)
