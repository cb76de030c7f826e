"""Restarts budgeted per time window: an agent that keeps dying stops, one that died once a week
does not run out of restarts.

Ray counts ``max_restarts`` for the actor's whole life: five crashes spread over a month end an
agent for good, while a crash loop of five restarts in a second is exactly as fatal. So Ray is told
to restart agents always (``max_restarts=-1``) and each restarted agent consults its
``RestartBudget`` first: a JSON file in the state directory, ``STATE_DIR/<role>.restarts.json``,
holding the times of its recent restarts. More than ``limit`` restarts within ``window_s`` and the
agent gives up: it writes why into the same file and exits for good (Ray then marks it dead,
and ``stratagem status`` prints that reason). A fresh deployment (``up``, ``up --replace``) starts
the count again.

The file lives on the node the agent runs on; an agent that Ray moves to another node starts a
count there (it can never restart more often than ``limit`` per window on one node). Ray-free.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stratagem.runtime.config._statedir import write_private

__all__ = ["RestartBudget", "gave_up_reason"]


@dataclass(slots=True)
class RestartBudget:
    """At most ``limit`` restarts of ``role``'s agent within ``window_s`` seconds.

    Args:
        path: The JSON file that keeps the restart times.
        limit: Restarts allowed per window; -1 means always restart.
        window_s: The window, seconds.
        clock: Wall-clock seconds (a test passes its own).
    """

    path: Path
    limit: int
    window_s: float
    clock: Callable[[], float] = time.time

    def started(self) -> None:
        """A fresh deployment: forget earlier restarts (and a reason to give up)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def restarted(self) -> str | None:
        """Count this restart; the reason to give up when the budget is spent, else ``None``."""
        if self.limit < 0:
            return None
        now = self.clock()
        recent = [t for t in self._read().get("restarts", []) if now - t < self.window_s]
        recent.append(now)
        reason = None
        if len(recent) > self.limit:
            reason = (
                f"gave up: restarted {len(recent)} times within {self.window_s:g} s, more than "
                f"STRATAGEM_MAX_RESTARTS={self.limit} per STRATAGEM_RESTART_WINDOW_S; see the "
                "agent's log for why it keeps dying, then 'stratagem up --replace'"
            )
        self._write({"restarts": recent, "gave_up": reason})
        return reason

    def _read(self) -> dict[str, list[float]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            times = [float(t) for t in data.get("restarts", [])]
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # missing or damaged: count from here
        return {"restarts": times}

    def _write(self, data: dict[str, object]) -> None:
        # An unwritable state dir is reported by the agent's health checks.
        with contextlib.suppress(OSError):
            write_private(self.path, json.dumps(data))


def gave_up_reason(path: Path) -> str:
    """Why an agent gave up restarting (``""`` when it did not, or the file is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        reason = data.get("gave_up") if isinstance(data, dict) else None
    except (OSError, ValueError):
        return ""
    return reason if isinstance(reason, str) else ""
