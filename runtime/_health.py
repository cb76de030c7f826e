"""What an agent checks about its own storage, so that ``status`` reports a broken store instead
of an agent that says it serves while every write fails.

Two problems are looked for, each time the agent is asked for its ``info``:

- its SQLite plan store is missing or is not the file it opened (deleted, or deleted and
  recreated empty: the identity kept is the file's device and inode), which would make a
  restarted agent remember no plans;
- its state directory is not writable (a probe file cannot be created there), where answers,
  audit records and plans are written.

A PostgreSQL store (``STRATAGEM_STORE_URL``) is not watched here: its own errors reach callers.
"""

from __future__ import annotations

import os
from pathlib import Path

from stratagem.runtime._settings import Settings

__all__ = ["StoreWatch"]


class StoreWatch:
    """Remembers which plan store file ``role``'s agent opened and finds what went wrong since.

    Args:
        settings: The deployment's settings.
        role: The agent's role.
    """

    def __init__(self, settings: Settings, role: str) -> None:
        self._state_dir = settings.state_dir
        self._plans: Path | None = None
        self._identity: tuple[int, int] | None = None
        if settings.store_url is None:
            self._plans = settings.plans_path(role)
            self._identity = _identity(self._plans)

    def problems(self, plans_written: int) -> list[str]:
        """What is wrong with the agent's storage now, one line each (empty: nothing).

        Args:
            plans_written: How many plans the agent remembers (said in the message).
        """
        found: list[str] = []
        if self._plans is not None and self._identity is not None:
            now = _identity(self._plans)
            if now is None:
                found.append(
                    f"plan store missing: {self._plans} was deleted after {plans_written} plans "
                    "were written"
                )
            elif now != self._identity:
                found.append(
                    f"plan store replaced: {self._plans} is not the file this agent opened "
                    f"(deleted and recreated after {plans_written} plans were written)"
                )
        probe = self._state_dir / f".probe-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            found.append(f"state dir not writable: {self._state_dir} ({exc.strerror})")
        return found


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino
