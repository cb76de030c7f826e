"""``down`` after the local head died: the head's leftover Ray processes are gone (their sockets
with them) when ``clean_up`` returns. Before, it sent SIGKILL and returned at once, so on a loaded
machine a killed process still held its listening sockets when ``down`` said it had cleaned up
(seen in CI: four ports still listening)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from stratagem.runtime import LaunchError, load_settings
from stratagem.runtime.host import _local
from stratagem.runtime.host._local import LocalCluster


class _Processes:
    """A process table: SIGTERM is ignored, and a SIGKILLed process is listed for ``lag`` more
    scans (the kernel tearing it down) before it is gone (``lag=None``: never)."""

    def __init__(self, pids: list[int], lag: int | None) -> None:
        self.listed = {pid: -1 for pid in pids}  # -1: running; n >= 0: scans left before gone
        self.lag = lag

    def members(self, head_id: str) -> list[int]:
        assert head_id == "head-1"
        shown = sorted(self.listed)
        for pid, left in list(self.listed.items()):
            if left == 0:
                del self.listed[pid]
            elif left > 0:
                self.listed[pid] = left - 1
        return shown

    def alive(self, pid: int) -> bool:
        return pid in self.listed

    def kill(self, pid: int, sig: int) -> None:
        if sig == signal.SIGKILL and self.lag is not None and self.listed.get(pid) == -1:
            self.listed[pid] = self.lag


@pytest.fixture
def head(tmp_path: Path) -> LocalCluster:
    return LocalCluster(address="127.0.0.1:6379", pid=4_000_000, started=1, head_id="head-1")


def _table(monkeypatch: pytest.MonkeyPatch, lag: int | None) -> _Processes:
    table = _Processes([101, 102], lag)
    monkeypatch.setattr(_local, "_members", table.members)
    monkeypatch.setattr(_local, "alive", table.alive)
    monkeypatch.setattr(os, "kill", table.kill)
    return table


def test_clean_up_returns_once_the_killed_processes_are_gone(
    head: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = _table(monkeypatch, lag=3)
    cleaned = head.clean_up(load_settings(state_dir=tmp_path), timeout_s=2)
    assert table.listed == {}
    assert cleaned[0] == "the dead head's 2 leftover Ray processes"


def test_a_process_that_will_not_die_is_named(
    head: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _table(monkeypatch, lag=None)
    with pytest.raises(LaunchError, match=r"leftover Ray processes 101, 102 did not stop"):
        head.clean_up(load_settings(state_dir=tmp_path), timeout_s=0.3)
