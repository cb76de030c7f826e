"""The pieces of Ray's trust boundary that need no running Ray (see tests/e2e/test_ray_boundary.py
for the head, the drivers and the external cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.runtime import load_settings
from stratagem.runtime.host._rayauth import (
    create_token,
    head_environment,
    is_loopback,
)


def test_a_new_ray_token_is_private_random_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ray.token"
    first = create_token(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == first
    assert len(first) == 64
    assert set(first) <= set("0123456789abcdef")
    second = create_token(path)
    assert second != first
    assert path.read_text() == second
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["ray.token"]


def test_the_head_asks_for_the_file_token_and_stays_on_loopback(tmp_path: Path) -> None:
    token = tmp_path / "ray.token"
    given = {"RAY_AUTH_TOKEN": "other", "RAY_AUTH_MODE": "disabled", "A": "1"}
    env = head_environment(token, given)
    assert env == {
        "A": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("192.0.2.2", False),
        ("10.0.0.10", False),
        ("0.0.0.0", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_allowing_an_unauthenticated_ray_is_an_explicit_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STRATAGEM_ALLOW_UNAUTHENTICATED_RAY", raising=False)
    assert load_settings().allow_unauthenticated_ray is False
    monkeypatch.setenv("STRATAGEM_ALLOW_UNAUTHENTICATED_RAY", "1")
    assert load_settings().allow_unauthenticated_ray is True
