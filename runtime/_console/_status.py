"""What Ray knows about the agents (node, process, restarts, why one is gone): the answer of
``stratagem status --json``, asked in a child process, so the console itself never becomes a Ray
driver (its requests never wait on Ray). Answers are kept a few seconds and one question is asked
at a time, whatever the number of browsers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final

from stratagem.runtime._settings import Settings

__all__ = ["RayStatus", "RayView"]

logger = logging.getLogger(__name__)

FRESH_S: Final = 10.0
"""How long an answer is shown before Ray is asked again."""
TIMEOUT_S: Final = 30.0
"""How long the child process may take."""

_PROGRAM: Final = "from stratagem.runtime._cli import main; main()"


@dataclass(frozen=True, slots=True)
class RayView:
    """Ray's view of the agents, or why it could not be had.

    Attributes:
        agents: Per role, ``stratagem status --json``'s record (``node_ip``, ``pid``,
            ``restarts``, ``state``, ``health``, ``problem``...).
        problem: Why Ray could not be asked (``""`` when it was).
        asked_at: When (wall clock).
    """

    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    problem: str = ""
    asked_at: float = 0.0


class RayStatus:
    """Asks ``stratagem status --json`` for the deployment ``settings`` name.

    Args:
        settings: The deployment's settings (its state directory and Ray address are passed on).
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._last: RayView | None = None
        self._lock = asyncio.Lock()

    def _command(self) -> list[str]:
        command = [sys.executable, "-c", _PROGRAM, "status", "--json"]
        command += ["--state-dir", str(self._settings.state_dir)]
        if self._settings.address:
            command += ["--address", self._settings.address]
        return command

    async def view(self) -> RayView:
        """The latest answer (asked again when older than ``FRESH_S``)."""
        async with self._lock:
            last = self._last
            if last is not None and time.time() - last.asked_at < FRESH_S:
                return last
            self._last = await self._ask()
            return self._last

    async def _ask(self) -> RayView:
        now = time.time()
        try:
            child = await asyncio.create_subprocess_exec(
                *self._command(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return RayView(problem=f"cannot run 'stratagem status': {exc}", asked_at=now)
        try:
            out, err = await asyncio.wait_for(child.communicate(), TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            return RayView(problem=f"Ray did not answer within {TIMEOUT_S:g} s", asked_at=now)
        try:
            answer = json.loads(out.decode("utf-8", "replace") or "null")
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("agents"), list):
            lines = err.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {child.returncode}"
            return RayView(problem=why.removeprefix("error: "), asked_at=now)
        agents = {
            str(record.get("role", "")): record
            for record in answer["agents"]
            if isinstance(record, dict)
        }
        return RayView(agents, "", now)
