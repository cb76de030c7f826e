"""``down`` after the local head died: the head's leftover Ray processes are gone (their sockets
with them) when ``clean_up`` returns. Before, it sent SIGKILL and returned at once, so on a loaded
machine a killed process still held its listening sockets when ``down`` said it had cleaned up
(seen in CI: four ports still listening)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
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

    def members(self, head_id: str, session: int | None = None) -> list[int]:
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


_TREE = """
import os, subprocess, sys, time
env = dict(os.environ)
marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
del env["STRATAGEM_RAY_HEAD_ID"]
# Ray's agents write their process title over their environment: a process of the head's
# session without the head's id, holding a log of the Ray session (named after the head's pid)
# when a folder is given.
folder = sys.argv[1] if len(sys.argv) > 1 else ""
holds = (
    f"import os; os.makedirs('{folder}/session_t_{os.getpid()}', exist_ok=True);"
    f" log = open('{folder}/session_t_{os.getpid()}/agent.log', 'w');"
    if folder
    else ""
)
unmarked = subprocess.Popen(
    [sys.executable, "-c", holds + "import time; print(flush=True); time.sleep(300)"],
    env=env,
    stdout=subprocess.PIPE,
)
unmarked.stdout.readline()  # its log is open
if folder:
    marked.kill()  # the head's processes that carry its id are gone
    marked.wait()
print(marked.pid, unmarked.pid, flush=True)
time.sleep(300)
"""


def _state(pid: int) -> str:
    """A process's state letter ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def _start_tree(head_id: str, folder: str = "") -> tuple[subprocess.Popen[str], int, int]:
    env = {**os.environ, _local.HEAD_ID: head_id}
    head = subprocess.Popen(
        [sys.executable, "-c", _TREE, *([folder] if folder else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # as ``up`` starts the head
    )
    assert head.stdout is not None
    marked, unmarked = map(int, head.stdout.readline().split())
    return head, marked, unmarked


@contextlib.contextmanager
def _dead_head(head_id: str, folder: str = "") -> Iterator[tuple[int, int, int]]:
    """A head started with ``_TREE`` and SIGKILLed: its pid and its two children's (killed on
    exit, whatever the test left)."""
    head, marked, unmarked = _start_tree(head_id, folder)
    try:
        head.kill()
        head.wait(timeout=30)
        yield head.pid, marked, unmarked
    finally:
        for pid in (marked, unmarked):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_dead_heads_session_goes_once_a_marked_process_proves_it(tmp_path: Path) -> None:
    # Real processes: a head (leader of its own session) with two children, one of them without
    # the head's id in its environment. SIGKILL the head, then clean up after it.
    with _dead_head("head-real") as (pid, marked, unmarked):
        record = LocalCluster(address="127.0.0.1:1", pid=pid, started=1, head_id="head-real")
        cleaned = record.clean_up(load_settings(state_dir=tmp_path), timeout_s=10)
        assert cleaned[0] == "the dead head's 2 leftover Ray processes"
        assert _state(marked) in ("", "Z")
        assert _state(unmarked) in ("", "Z")


def test_an_unproven_session_is_left_alone(tmp_path: Path) -> None:
    # Another id in the record: no process of the session proves it, and nothing is signalled.
    with _dead_head("head-other") as (pid, marked, unmarked):
        record = LocalCluster(address="127.0.0.1:1", pid=pid, started=1, head_id="head-real")
        record.clean_up(load_settings(state_dir=tmp_path), timeout_s=1)
        assert _state(marked) not in ("", "Z")
        assert _state(unmarked) not in ("", "Z")


def test_a_session_whose_only_leftover_holds_the_heads_ray_session_log_goes(
    tmp_path: Path,
) -> None:
    # As after a real head's SIGKILL: only Ray's agents are left, their environment written over,
    # their logs open in the Ray session folder named after the head's pid.
    with _dead_head("head-real", str(tmp_path / "ray")) as (pid, marked, unmarked):
        assert _state(marked) in ("", "Z")
        record = LocalCluster(address="127.0.0.1:1", pid=pid, started=1, head_id="head-real")
        cleaned = record.clean_up(load_settings(state_dir=tmp_path / "s"), timeout_s=10)
        assert cleaned[0] == "the dead head's 1 leftover Ray processes"
        assert _state(unmarked) in ("", "Z")
