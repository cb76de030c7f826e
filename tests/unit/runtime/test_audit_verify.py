"""``stratagem audit verify`` on the deployment's log: seals kept where every node reads them
(PostgreSQL), and seals that cannot be checked never pass for a verified chain."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stratagem.protocol import AuditSealer, SqliteAuditLog, load_or_create_key
from stratagem.runtime._cli import app
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.config._stores import open_audit_heads, open_audit_log


def _append(log: object, count: int) -> None:
    for index in range(count):
        log.append(  # type: ignore[attr-defined]
            actor="orchestrator",
            action="call.accepted",
            target="perception",
            capability="ExtractEntities",
            request_id=f"{index:032x}",
            digest="0" * 64,
        )


def _verify(state_dir: Path, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["audit", "verify", "--state-dir", str(state_dir)],
        env={"STRATAGEM_STORE_URL": "", **env},
    )
    return result.exit_code, " ".join(result.output.split())


def test_seals_without_their_key_fail_verification(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 5)
        AuditSealer(
            log, load_or_create_key(settings.audit_key_path), open_audit_heads(settings)
        ).seal()
    code, out = _verify(tmp_path)
    assert code == 0, out
    assert "1 signed heads verified" in out

    settings.audit_key_path.unlink()
    code, out = _verify(tmp_path)
    assert code == 1, out
    assert "signed heads exist in" in out
    assert "the key to check them is missing" in out

    # A log that was never sealed still verifies as a chain without a key.
    settings.audit_heads_path.unlink()
    code, out = _verify(tmp_path)
    assert code == 0, out
    assert "chain only" in out


@pytest.mark.postgres
def test_seals_in_postgresql_are_checked_from_any_node(tmp_path: Path, postgres_url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(postgres_url)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    node_a = tmp_path / "node-a"
    node_b = tmp_path / "node-b"  # another machine: an empty state dir but for the key
    settings = load_settings(state_dir=node_a, store_url=url)
    log = open_audit_log(settings)
    try:
        key = load_or_create_key(settings.audit_key_path)
        sealer = AuditSealer(log, key, open_audit_heads(settings))
        _append(log, 3)
        assert sealer.seal() is not None
        _append(log, 4)
        assert sealer.seal() is not None
        # A sealer restarted elsewhere finds the last head in the table, not in a file.
        again = AuditSealer(log, key, open_audit_heads(settings))
        assert again.seal() is None
    finally:
        log.close()
    assert not settings.audit_heads_path.exists()
    node_b.mkdir()
    shutil.copy2(settings.audit_key_path, node_b / "audit.key")
    os.chmod(node_b / "audit.key", 0o600)
    code, out = _verify(node_b, STRATAGEM_STORE_URL=url)
    assert code == 0, out
    assert "7 records, 2 signed heads verified" in out

    # The table is append-only, like the log.
    import psycopg

    with psycopg.connect(postgres_url) as conn, pytest.raises(psycopg.Error):
        conn.execute("DELETE FROM stratagem.audit_heads")


def test_the_log_is_private_and_a_key_kept_apart_defeats_a_resigned_rewrite(
    tmp_path: Path,
) -> None:
    import stat

    from tests.unit.protocol.test_audit_seal import _rechain, _tamper

    state = tmp_path / "state"
    vault = tmp_path / "vault"  # where the operator keeps the key: not the state dir
    key_file = vault / "audit.key"
    settings = load_settings(state_dir=state, audit_key_file=key_file)
    assert settings.audit_key_path == key_file
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 12)
        AuditSealer(log, load_or_create_key(key_file), open_audit_heads(settings)).seal()
    for name in ("audit.sqlite3", "audit.sqlite3-wal", "audit.heads"):
        path = state / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    env = {"STRATAGEM_AUDIT_KEY_FILE": str(key_file)}
    assert _verify(state, **env)[0] == 0

    # Someone who can write the state dir: edit a record, recompute the chain, and sign the new
    # head with a key of their own (they cannot read the vault).
    _tamper(settings.audit_path, "UPDATE audit SET actor = 'nobody' WHERE seq = 5")
    _rechain(settings.audit_path)
    forged_key = state / "audit.key"
    with SqliteAuditLog(settings.audit_path) as log:
        AuditSealer(log, load_or_create_key(forged_key), open_audit_heads(settings)).seal()
    code, out = _verify(state, **env)
    assert code == 1, out
    assert "does not verify" in out or "rewritten" in out


def test_a_damaged_audit_file_is_one_line(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 200)
    data = bytearray(settings.audit_path.read_bytes())
    # Overwrite the middle pages (not the header), as a disk error or a careless edit would.
    middle = len(data) // 2
    data[middle : middle + 8192] = b"\xde\xad\xbe\xef" * 2048
    settings.audit_path.write_bytes(bytes(data))
    code, out = _verify(tmp_path)
    assert code == 1, out
    assert "cannot be read" in out
    assert "Traceback" not in out


def _archive(state_dir: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["audit", "archive", "--state-dir", str(state_dir), *args],
        env={"STRATAGEM_STORE_URL": ""},
    )
    return result.exit_code, " ".join(result.output.split())


def test_archive_moves_old_records_and_verify_reads_the_segments(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 40)
        AuditSealer(
            log, load_or_create_key(settings.audit_key_path), open_audit_heads(settings)
        ).seal()
    # Nothing is 30 days old yet.
    assert _archive(tmp_path) == (0, "no audit record older than 30 days to archive")
    code, out = _archive(tmp_path, "--older-than-days", "0")
    assert code == 0, out
    assert "archived 39 audit records (1..39)" in out
    with SqliteAuditLog(settings.audit_path) as log:
        assert [r.seq for r in log.records()] == [40]
    code, out = _verify(tmp_path)
    assert code == 0, out
    assert "40 records, 1 signed heads verified" in out

    # The segments moved elsewhere: verify reads them there, and fails without them.
    moved = tmp_path / "cold-storage"
    settings.audit_archive_dir.rename(moved)
    code, out = _verify(tmp_path)
    assert code == 1, out
    assert "records 1..39 are missing" in out
    result = CliRunner().invoke(
        app,
        ["audit", "verify", "--state-dir", str(tmp_path), "--archive", str(moved)],
        env={"STRATAGEM_STORE_URL": ""},
    )
    assert result.exit_code == 0, result.output


def test_a_damaged_segment_and_bad_archive_options_are_one_line(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 5)
    assert _archive(tmp_path, "--older-than-days", "0")[0] == 0
    (segment,) = settings.audit_archive_dir.iterdir()
    segment.write_bytes(b"\x1f\x8b damaged")
    code, out = _verify(tmp_path)
    assert code == 1, out
    assert "cannot be read" in out
    assert "Traceback" not in out
    code, out = _archive(tmp_path, "--older-than-days", "-1")
    assert code == 2, out
    result = CliRunner().invoke(
        app,
        ["audit", "verify", "--state-dir", str(tmp_path), "--archive", str(tmp_path / "none")],
        env={"STRATAGEM_STORE_URL": ""},
    )
    assert result.exit_code == 2
    assert "no folder of archived audit segments" in result.output


def test_heads_cut_from_the_heads_file_still_count_when_copied_elsewhere(tmp_path: Path) -> None:
    from tests.unit.protocol.test_audit_seal import _rechain, _tamper

    state, vault = tmp_path / "state", tmp_path / "vault"
    vault.mkdir()
    copy = vault / "audit.heads"
    settings = load_settings(state_dir=state, audit_heads_copy=copy)
    with SqliteAuditLog(settings.audit_path) as log:
        sealer = AuditSealer(
            log, load_or_create_key(settings.audit_key_path), open_audit_heads(settings)
        )
        _append(log, 10)
        sealer.seal()
        _append(log, 10)
        sealer.seal()
    assert copy.read_bytes() == settings.audit_heads_path.read_bytes()
    env = {"STRATAGEM_AUDIT_HEADS_COPY": str(copy)}
    code, out = _verify(state, **env)
    assert code == 0, out
    assert "2 signed heads verified" in out
    # Someone who can write the state dir rewrites records 15.. and cuts the head that covered
    # them from audit.heads: the state dir alone now verifies, the copy does not let it.
    _tamper(settings.audit_path, "UPDATE audit SET actor = 'nobody' WHERE seq = 15")
    _rechain(settings.audit_path)
    first_line = settings.audit_heads_path.read_bytes().splitlines(keepends=True)[0]
    settings.audit_heads_path.write_bytes(first_line)
    assert _verify(state)[0] == 0  # without the copy the rewrite goes unseen
    code, out = _verify(state, **env)
    assert code == 1, out
    assert "rewritten" in out


def test_a_token_for_a_client_of_your_own_is_a_standard_jwt(tmp_path: Path) -> None:
    import jwt

    from stratagem.protocol import ClusterSecret, TokenSigner

    secret = ClusterSecret.load_or_create(tmp_path / "cluster.secret")
    env = {
        "STRATAGEM_STORE_URL": "",
        "STRATAGEM_AUTH": "token",
        "STRATAGEM_SECRET_FILE": str(tmp_path / "cluster.secret"),
    }
    result = CliRunner().invoke(
        app,
        ["token", "--state-dir", str(tmp_path), "--ttl", "60"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    issued = result.output.strip()
    assert TokenSigner(secret).verify(issued)[0] == "operator"
    assert jwt.get_unverified_header(issued)["kid"] == secret.key_id
    refused = CliRunner().invoke(
        app,
        ["token", "--state-dir", str(tmp_path), "--ttl", "99999999"],
        env=env,
    )
    assert refused.exit_code == 2
    assert "longer than STRATAGEM_TOKEN_TTL_S" in refused.output


def test_a_configured_heads_copy_that_was_deleted_fails_verification(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "audit.heads.copy"
    copy.parent.mkdir()
    settings = load_settings(state_dir=tmp_path / "state", audit_heads_copy=copy)
    with SqliteAuditLog(settings.audit_path) as log:
        _append(log, 5)
        AuditSealer(
            log, load_or_create_key(settings.audit_key_path), open_audit_heads(settings)
        ).seal()
    env = {"STRATAGEM_AUDIT_HEADS_COPY": str(copy)}
    code, out = _verify(settings.state_dir, **env)
    assert code == 0, out
    copy.unlink()
    code, out = _verify(settings.state_dir, **env)
    assert code == 1, out
    assert f"the audit heads copy {copy} (STRATAGEM_AUDIT_HEADS_COPY) is missing" in out
    # Without the setting nothing says a copy was kept: the primary heads verify.
    assert _verify(settings.state_dir)[0] == 0
