"""Turns at a model server shared by every process on a node: ``FileModelLimiter``.

The agents are separate processes (Ray actors) on a node, each with its own model client; one
CPU model server answers them one at a time. ``FileModelLimiter`` (an ``agents.ModelLimiter``)
keeps one queue per server for all of them in a folder of the state directory,
``STATE_DIR/model-slots/<digest of the server URL>/``:

* a request joins the queue as a file named by the node's monotonic clock (first come, first
  served), locked (``flock``) by its process for as long as it waits or holds its turn;
* it holds a turn while fewer than ``limit`` live entries are older than its own;
* it leaves by deleting its entry; an entry no process holds locked any more (its process died)
  is skipped and deleted by the next request that finds it, so a crash never keeps a turn.

Waiting is polling (10 ms, backing off to 100 ms): a model call takes seconds. Nothing here needs
Ray; the same folder serves an embedded deployment's agents and a test's processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from stratagem.agents import ModelTurn, TurnTimeoutError

__all__ = ["FileModelLimiter", "slots_folder"]

_PREFIX: Final = "q-"
_FIRST_POLL_S: Final = 0.01
_LAST_POLL_S: Final = 0.1


def slots_folder(state_dir: Path, url: str) -> Path:
    """The queue folder of the server at ``url`` under ``state_dir``."""
    digest = hashlib.sha256(url.rstrip("/").encode("utf-8")).hexdigest()[:16]
    return state_dir / "model-slots" / digest


def _alive(path: Path) -> bool | None:
    """Whether the entry's process still holds it (``None``: the entry is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class FileModelLimiter:
    """The turns at one model server of every process on this node (see the module).

    Args:
        folder: The server's queue folder (``slots_folder(state_dir, url)``); made 0700.
        limit: Requests the server is given at once.
    """

    def __init__(self, folder: Path, limit: int = 1) -> None:
        if limit < 1:
            raise ValueError("a model server's limit must be at least 1")
        self.folder = folder
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def __repr__(self) -> str:
        return f"FileModelLimiter({str(self.folder)!r}, limit={self._limit})"

    def _join(self) -> tuple[int, Path]:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"{time.monotonic_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}"
        scratch = self.folder / f".{name}"
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Locked before it is visible: no one takes a fresh entry for a dead one.
        entry = self.folder / f"{_PREFIX}{name}"
        os.rename(scratch, entry)
        return fd, entry

    def _ahead(self, entry: Path) -> int:
        """Live entries older than ``entry`` (dead ones deleted on the way)."""
        ahead = 0
        for other in sorted(self.folder.glob(f"{_PREFIX}*")):
            if other.name >= entry.name:
                break
            alive = _alive(other)
            if alive:
                ahead += 1
            elif alive is False:
                with contextlib.suppress(FileNotFoundError):
                    other.unlink()
        return ahead

    @staticmethod
    def _leave(fd: int, entry: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
        os.close(fd)

    @contextlib.asynccontextmanager
    async def turn(self, deadline: float | None) -> AsyncIterator[ModelTurn]:
        started = time.monotonic()
        fd, entry = self._join()
        try:
            ahead = first = self._ahead(entry)
            delay = _FIRST_POLL_S
            while ahead >= self._limit:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TurnTimeoutError(now - started, first)
                pause = delay if deadline is None else min(delay, deadline - now)
                await asyncio.sleep(pause)
                delay = min(_LAST_POLL_S, delay * 2)
                ahead = self._ahead(entry)
        except BaseException:
            self._leave(fd, entry)
            raise
        turn = ModelTurn(ahead=first, waited_s=time.monotonic() - started)
        try:
            yield turn
        finally:
            turn.end(lambda: self._leave(fd, entry))
