"""A ``Deployment`` leaves Ray only if it joined it: a process already in Ray (the embedded Ray
of a test session, a notebook's ``ray.init()``) keeps it when an operator that looked up the
agents through Ray closes. Before, ``disconnect`` shut down whatever Ray the process was in, so
an ``Operator`` asking Ray for a restarted agent's endpoint stopped the test session's own Ray
(and every later test of that worker hung joining a Ray that was gone)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stratagem.runtime import load_settings
from stratagem.runtime.host import _launcher, _rayjoin
from stratagem.runtime.host._launcher import Deployment
from stratagem.runtime.host._ray_directory import RayDirectory


class _Ray:
    """Ray's driver calls, recorded: whether the process is in Ray, and what was asked (the
    rest of Ray's module as it is)."""

    def __init__(self, real: Any, *, initialized: bool) -> None:
        self.real = real
        self.initialized = initialized
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **_: Any) -> None:
        self.calls.append("init")
        self.initialized = True

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.initialized = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> _Ray:
    fake = _Ray(_launcher.ray, initialized=True)
    # The launcher's Ray only, not the module every other test shares.
    monkeypatch.setattr(_launcher, "ray", fake)
    monkeypatch.setattr(_rayjoin, "ray", fake)
    return fake


def test_a_process_already_in_ray_stays_in_it_after_disconnect(
    fake_ray: _Ray, tmp_path: Path
) -> None:
    deployment = Deployment(load_settings(state_dir=tmp_path))
    deployment.connect()
    deployment.disconnect()
    assert fake_ray.calls == []
    assert fake_ray.initialized


def test_the_ray_directory_leaves_the_processs_own_ray_running(
    fake_ray: _Ray, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(Deployment, "status", lambda self, timeout_s=10.0: [])
    directory = RayDirectory(load_settings(state_dir=tmp_path))

    async def look_up_and_close() -> dict[str, str]:
        try:
            return await directory.endpoints()
        finally:
            await directory.aclose()

    assert asyncio.run(look_up_and_close()) == {}
    assert fake_ray.calls == []
    assert fake_ray.initialized


def test_a_ray_connect_joined_is_left_by_disconnect(fake_ray: _Ray, tmp_path: Path) -> None:
    fake_ray.initialized = False
    deployment = Deployment(load_settings(state_dir=tmp_path))
    deployment.connect(only_embedded=True)
    deployment.disconnect()
    deployment.disconnect()  # a second call has nothing left to do
    assert fake_ray.calls == ["init", "shutdown"]


class _RefusingRay(_Ray):
    """A Ray whose ``init`` raises the given errors in turn, then joins."""

    def __init__(self, real: Any, errors: list[Exception]) -> None:
        super().__init__(real, initialized=False)
        self.errors = errors

    def init(self, **kwargs: Any) -> None:
        self.calls.append(f"init {kwargs['address']}")
        if self.errors:
            raise self.errors.pop(0)
        self.initialized = True


def _refusal() -> ConnectionAbortedError:
    # What Ray's client raises when its server could not start this session's server process.
    return ConnectionAbortedError(
        "Initialization failure from server:\npsutil.ZombieProcess: PID still exists"
    )


def _refusing(monkeypatch: pytest.MonkeyPatch, errors: list[Exception]) -> _RefusingRay:
    fake = _RefusingRay(_launcher.ray, errors)
    monkeypatch.setattr(_launcher, "ray", fake)
    monkeypatch.setattr(_rayjoin, "ray", fake)
    monkeypatch.setattr(_rayjoin.time, "sleep", lambda _: None)
    return fake


def test_a_ray_client_session_the_server_could_not_start_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _refusing(monkeypatch, [_refusal(), _refusal()])
    deployment = Deployment(load_settings(state_dir=tmp_path, address="ray://10.0.0.1:10001"))
    deployment.connect(allow_embedded=False)
    assert fake.calls == ["init ray://10.0.0.1:10001"] * 3
    assert fake.initialized
    assert deployment.mode == "cluster"


def test_the_last_refusal_and_any_other_failure_are_reported_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _refusing(monkeypatch, [_refusal() for _ in range(_rayjoin.RAY_CLIENT_TRIES)])
    deployment = Deployment(load_settings(state_dir=tmp_path, address="ray://10.0.0.1:10001"))
    with pytest.raises(_launcher.LaunchError, match=r"cannot reach Ray at ray://10\.0\.0\.1:10001"):
        deployment.connect(allow_embedded=False)
    assert len(fake.calls) == _rayjoin.RAY_CLIENT_TRIES

    # Not the client server's refusal (here: nothing listens): no second try.
    fake = _refusing(monkeypatch, [ConnectionError("ray client connection timeout"), _refusal()])
    with pytest.raises(_launcher.LaunchError, match="connection timeout"):
        deployment.connect(allow_embedded=False)
    assert fake.calls == ["init ray://10.0.0.1:10001"]

    # A GCS address (not through the client): a refusal is not retried either.
    fake = _refusing(monkeypatch, [_refusal()])
    direct = Deployment(load_settings(state_dir=tmp_path, address="10.0.0.1:6379"))
    with pytest.raises(_launcher.LaunchError):
        direct.connect(allow_embedded=False)
    assert fake.calls == ["init 10.0.0.1:6379"]
