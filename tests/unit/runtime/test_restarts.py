"""RestartBudget: restarts counted per time window, a reason to give up, a fresh start."""

from __future__ import annotations

from pathlib import Path

from stratagem.runtime.config._restarts import RestartBudget, gave_up_reason


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_restarts_spread_over_time_never_run_out(tmp_path: Path) -> None:
    clock = Clock()
    budget = RestartBudget(tmp_path / "r.json", limit=2, window_s=60.0, clock=clock)
    for _ in range(50):  # one crash every 31 s: at most two in any 60 s
        assert budget.restarted() is None
        clock.now += 31.0
    assert gave_up_reason(tmp_path / "r.json") == ""


def test_more_restarts_than_the_limit_within_the_window_give_up(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "r.json"
    budget = RestartBudget(path, limit=2, window_s=60.0, clock=clock)
    assert budget.restarted() is None
    clock.now += 10
    assert budget.restarted() is None
    clock.now += 10
    reason = budget.restarted()
    assert reason is not None
    assert reason.startswith("gave up: restarted 3 times within 60 s")
    assert gave_up_reason(path) == reason
    # A new process reads the same file (the count survives the restarts it counts).
    again = RestartBudget(path, limit=2, window_s=60.0, clock=clock)
    assert again.restarted() is not None
    # A fresh deployment starts over.
    again.started()
    assert not path.exists()
    assert again.restarted() is None


def test_always_restart_and_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    always = RestartBudget(path, limit=-1, window_s=1.0)
    assert all(always.restarted() is None for _ in range(100))
    path.write_text("{not json")
    budget = RestartBudget(path, limit=1, window_s=60.0)
    assert budget.restarted() is None  # counts from here
    assert budget.restarted() is not None
    assert gave_up_reason(tmp_path / "missing.json") == ""
