"""The extensions ``stratagem up`` records in the state directory, and the settings that take
them when nothing else names any (``runtime.config._deployed``)."""

from __future__ import annotations

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
