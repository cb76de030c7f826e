"""The extensions ``stratagem up`` records in the state directory, and the settings that take
them when nothing else names any (``runtime.config._deployed``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stratagem.runtime import load_settings
from stratagem.runtime.config._deployed import (
    RECORD_FILE,
    DeploymentRecord,
    absolute_extensions,
    read_record,
    remove_record,
    write_record,
)

CRITIC = "examples.extensions.critic"


@pytest.fixture(autouse=True)
def _no_extensions_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATAGEM_EXTENSIONS", raising=False)
    monkeypatch.delenv("STRATAGEM_EXTENSION_PATHS", raising=False)
    monkeypatch.setenv("STRATAGEM_CONFIG", "/nonexistent/config.toml")


def test_a_record_round_trips(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None
    record = DeploymentRecord(extensions=(CRITIC, "/x/y.py:setup"), extension_paths=(tmp_path,))
    write_record(tmp_path, record)
    assert read_record(tmp_path) == record
    assert (tmp_path / RECORD_FILE).stat().st_mode & 0o777 == 0o600
    assert remove_record(tmp_path) is True
    assert remove_record(tmp_path) is False
    assert read_record(tmp_path) is None


def test_file_extensions_are_made_absolute(tmp_path: Path) -> None:
    assert absolute_extensions([CRITIC, "mine.py", "sub/other.py:setup", "m:f"], tmp_path) == (
        CRITIC,
        str(tmp_path / "mine.py"),
        str(tmp_path / "sub" / "other.py") + ":setup",
        "m:f",
    )


def test_a_record_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    write_record(tmp_path, DeploymentRecord(extensions=(CRITIC,)))
    os.chmod(tmp_path / RECORD_FILE, 0o666)
    assert read_record(tmp_path) is None
    (tmp_path / RECORD_FILE).unlink()
    (tmp_path / RECORD_FILE).symlink_to(tmp_path / "elsewhere.json")
    assert read_record(tmp_path) is None


def test_a_damaged_record_is_ignored(tmp_path: Path) -> None:
    (tmp_path / RECORD_FILE).write_text("{not json")
    os.chmod(tmp_path / RECORD_FILE, 0o600)
    assert read_record(tmp_path) is None


def test_settings_take_the_recorded_extensions_in_a_fresh_shell(tmp_path: Path) -> None:
    write_record(
        tmp_path,
        DeploymentRecord(extensions=(CRITIC,), extension_paths=(Path("/srv/checkout"),)),
    )
    settings = load_settings(state_dir=tmp_path)
    assert settings.extensions == [CRITIC]
    assert settings.extension_paths == [Path("/srv/checkout")]


def test_named_extensions_win_over_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_record(tmp_path, DeploymentRecord(extensions=(CRITIC,)))
    assert load_settings(state_dir=tmp_path, extensions=[]).extensions == []
    monkeypatch.setenv("STRATAGEM_EXTENSIONS", "")  # none, said in the shell
    assert load_settings(state_dir=tmp_path).extensions == []
    monkeypatch.setenv("STRATAGEM_EXTENSIONS", "examples.extensions.word_count")
    assert load_settings(state_dir=tmp_path).extensions == ["examples.extensions.word_count"]


def test_another_state_dir_has_its_own_record(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    write_record(tmp_path / "a", DeploymentRecord(extensions=(CRITIC,)))
    assert load_settings(state_dir=tmp_path / "a").extensions == [CRITIC]
    assert load_settings(state_dir=tmp_path / "b").extensions == []


def test_a_record_keeps_how_long_each_agent_may_plan(tmp_path: Path) -> None:
    planning = {"orchestrator": 0.0, "tactical": 180.0}
    record = DeploymentRecord(extensions=(CRITIC,), planning_timeout_s=planning)
    write_record(tmp_path, record)
    assert read_record(tmp_path) == record
    # A record written before it was kept says nothing of it: the settings give it then.
    write_record(tmp_path, DeploymentRecord(extensions=(CRITIC,)))
    got = read_record(tmp_path)
    assert got is not None
    assert got.planning_timeout_s is None


@pytest.mark.parametrize(
    "bad", [[1, 2], {"tactical": "long"}, {"tactical": -1}, {"tactical": 1e9}, {"tactical": True}]
)
def test_a_malformed_planning_entry_is_ignored_not_the_record(
    tmp_path: Path, bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / RECORD_FILE).write_text(
        json.dumps({"extensions": [CRITIC], "planning_timeout_s": bad}), encoding="utf-8"
    )
    os.chmod(tmp_path / RECORD_FILE, 0o600)
    got = read_record(tmp_path)
    assert got == DeploymentRecord(extensions=(CRITIC,))
    assert "planning_timeout_s: not role -> seconds" in caplog.text


def test_up_records_each_roles_planning_limit_from_its_settings(tmp_path: Path) -> None:
    from stratagem.runtime._cli._deploy import _with_planning

    settings = load_settings(
        state_dir=tmp_path,
        planners={"tactical": "model"},
        model_timeout_s=10.0,
        model_max_repairs=2,
    )
    roles = ("orchestrator", "perception", "strategic", "tactical")
    record = _with_planning(DeploymentRecord(extensions=(CRITIC,)), settings, roles)
    assert record.extensions == (CRITIC,)
    assert record.planning_timeout_s == {
        "orchestrator": 0.0,
        "perception": 0.0,
        "strategic": 0.0,
        "tactical": 30.0,  # (1 + 2 repairs) x 10 s
    }
