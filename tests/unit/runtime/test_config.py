"""Where settings come from: argument > environment > the config file's profile > default, and
a state directory that is the same from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_settings import SettingsError

from stratagem.runtime.config._settings import default_state_dir, load_settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user whose config and state folders are under ``tmp_path``; no STRATAGEM_* set."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("STRATAGEM_STATE_DIR", "STRATAGEM_CONFIG", "STRATAGEM_PROFILE", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work" / "deep" / "folder"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return tmp_path


def _config(home: Path, text: str) -> Path:
    path = home / "config" / "stratagem" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_default_is_the_users_own_from_any_folder(home: Path) -> None:
    assert default_state_dir() == home / "state" / "stratagem"
    assert load_settings().state_dir == (home / "state" / "stratagem").resolve()


def test_the_nearest_stratagem_folder_above_wins(home: Path) -> None:
    project = home / "work" / ".stratagem"
    project.mkdir()
    assert default_state_dir() == project.resolve()
    assert load_settings().state_dir == project.resolve()


def test_argument_beats_environment_beats_profile_beats_default(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _config(
        home,
        """
[default]
namespace = "from-default-table"
seed = 7

[profiles.prod]
namespace = "from-profile"
state_dir = "~/prod-state"
request_timeout_s = 12.5
""",
    )
    monkeypatch.setenv("HOME", str(home))
    plain = load_settings()
    assert (plain.namespace, plain.seed) == ("from-default-table", 7)
    prod = load_settings(profile="prod")
    assert prod.namespace == "from-profile"
    assert prod.state_dir == (home / "prod-state").resolve()
    assert prod.request_timeout_s == 12.5
    monkeypatch.setenv("STRATAGEM_NAMESPACE", "from-env")
    assert load_settings(profile="prod").namespace == "from-env"
    assert load_settings(profile="prod", namespace="from-argument").namespace == "from-argument"
    monkeypatch.setenv("STRATAGEM_PROFILE", "prod")
    assert load_settings().request_timeout_s == 12.5
    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(home / "env-state"))
    assert load_settings().state_dir == (home / "env-state").resolve()


def test_stratagem_config_names_another_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = home / "elsewhere.toml"
    other.write_text('[profiles.lab]\naddress = "ray://lab:10001"\n', encoding="utf-8")
    monkeypatch.setenv("STRATAGEM_CONFIG", str(other))
    assert load_settings(profile="lab").address == "ray://lab:10001"


@pytest.mark.parametrize(
    ("text", "profile", "complaint"),
    [
        ("[profiles.prod]\nseed = 1\n", "staging", "no profile 'staging'; valid: prod"),
        ("[default]\nsede = 1\n", None, "unknown setting 'sede'; valid: "),
        ("[profile.prod]\nseed = 1\n", None, "unknown table 'profile'; valid: default, profiles"),
        ("[default\n", None, "cannot read config file"),
        ("[profiles]\nprod = 3\n", "prod", "[profiles.prod] must be a table"),
    ],
)
def test_a_bad_config_file_is_one_named_problem(
    home: Path, text: str, profile: str | None, complaint: str
) -> None:
    path = _config(home, text)
    with pytest.raises(SettingsError) as caught:
        load_settings(profile=profile)
    assert complaint in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_profile_without_a_config_file_is_refused(home: Path) -> None:
    with pytest.raises(SettingsError, match=r"no config file .* for profile 'prod'"):
        load_settings(profile="prod")


def test_a_bad_value_in_the_profile_is_a_validation_error(home: Path) -> None:
    from pydantic import ValidationError

    _config(home, "[default]\nmax_restarts = 'often'\n")
    with pytest.raises(ValidationError, match="max_restarts"):
        load_settings()
