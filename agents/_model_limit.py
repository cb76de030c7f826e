"""Turns at a model server: one queue per server, shared by every client that uses it.

A CPU model server (llama.cpp's) answers one request at a time; a request it queues behind others
runs out its caller's time there, is abandoned and sent again, and the abandoned answer is still
generated. So the turns are taken on the client's side, once per server, by every agent that uses
it: ``ModelLimiter`` is that seam. ``OpenAIModelClient`` takes a turn before each call and gives it
back when the server is free of the call again (after an abandoned one, only once the server shows
it stopped: see ``ModelTurn.release_after``).

Two implementations:

* ``LocalModelLimiter``: the turns of one process (``asyncio``), first come first served;
  ``shared_limiter(url, limit)`` gives every client of a process the same one per server URL;
* ``runtime.FileModelLimiter``: the turns of every process on a node, through lock files in the
  state directory (the four agents are four processes on one node).

A turn is waited for no longer than the caller's deadline: one not given by then is a
``TurnTimeoutError`` and the request is never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "LocalModelLimiter",
    "ModelLimiter",
    "ModelTurn",
    "TurnTimeoutError",
    "shared_limiter",
]

logger = logging.getLogger(__name__)


class TurnTimeoutError(TimeoutError):
    """No turn at the model server before the caller's deadline: the request was not sent.

    Attributes:
        waited_s: How long it waited.
        ahead: Requests ahead of it when it joined the queue.
    """

    def __init__(self, waited_s: float, ahead: int) -> None:
        super().__init__(
            f"no turn at the model server within the call's deadline "
            f"(waited {waited_s:.1f} s behind {ahead} request(s))"
        )
        self.waited_s = waited_s
        self.ahead = ahead


@dataclass(slots=True)
class ModelTurn:
    """One request's turn at a model server.

    Attributes:
        ahead: Requests ahead of this one (being answered or waiting) when it joined.
        waited_s: How long it waited for its turn.
    """

    ahead: int = 0
    waited_s: float = 0.0
    _settle: Awaitable[object] | None = field(default=None, repr=False)

    def release_after(self, settled: Awaitable[object]) -> None:
        """Keep the turn after the call ends, until ``settled`` completes (in the background):
        the call was abandoned and the server may still be busy with it."""
        self._settle = settled

    def end(self, release: Callable[[], None]) -> None:
        """Give the turn back with ``release``: now, or once the abandoned call settled."""
        settle = self._settle
        if settle is None:
            release()
            return
        self._settle = None

        async def settle_then_release() -> None:
            try:
                await settle
            except Exception as exc:  # the turn goes back whatever the probe did
                logger.warning("model server: settling an abandoned call failed: %s", exc)
            finally:
                release()

        task = asyncio.get_running_loop().create_task(
            settle_then_release(), name="model turn settling"
        )
        _SETTLING.add(task)
        task.add_done_callback(_SETTLING.discard)


# Turns kept while an abandoned call settles (a task must be referenced until it ends).
_SETTLING: set[asyncio.Task[None]] = set()


class ModelLimiter(Protocol):
    """The turns at one model server."""

    @property
    def limit(self) -> int:
        """Requests the server is given at once."""

    def turn(self, deadline: float | None) -> contextlib.AbstractAsyncContextManager[ModelTurn]:
        """Wait for a turn (``deadline``: on ``time.monotonic()``, ``None`` for none) and hold it
        for the ``async with`` body (and, after ``ModelTurn.release_after``, until the abandoned
        call settled); raise ``TurnTimeoutError`` when the deadline passes first."""


class LocalModelLimiter:
    """The turns of one process at one server: ``limit`` at once, first come first served.

    Args:
        limit: Requests the server is given at once.
    """

    def __init__(self, limit: int = 1) -> None:
        if limit < 1:
            raise ValueError("a model server's limit must be at least 1")
        self._limit = limit
        self._holding = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def queued(self) -> int:
        """Requests waiting for a turn now."""
        return sum(1 for f in self._waiting if not f.done())

    @contextlib.asynccontextmanager
    async def turn(self, deadline: float | None) -> AsyncIterator[ModelTurn]:
        started = time.monotonic()
        ahead = self._holding + self.queued
        if self._holding < self._limit and not self.queued:
            self._holding += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait_for(asyncio.shield(waiter), remaining)
            except TimeoutError:
                if not self._give_up(waiter):
                    raise TurnTimeoutError(time.monotonic() - started, ahead) from None
            except asyncio.CancelledError:
                self._give_up(waiter)
                raise
        turn = ModelTurn(ahead=ahead, waited_s=time.monotonic() - started)
        try:
            yield turn
        finally:
            turn.end(self._release)

    def _give_up(self, waiter: asyncio.Future[None]) -> bool:
        """Leave the queue; ``True`` when the turn had been given meanwhile (it is then kept)."""
        if waiter.done() and not waiter.cancelled():
            return True
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiting.remove(waiter)
        return False

    def _release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on: _holding stays
                return
        self._holding -= 1


_SHARED: dict[tuple[str, int], LocalModelLimiter] = {}


def shared_limiter(url: str, limit: int) -> LocalModelLimiter:
    """The process's limiter for the server at ``url`` (one per URL and limit)."""
    key = (url.rstrip("/"), limit)
    found = _SHARED.get(key)
    if found is None:
        found = _SHARED[key] = LocalModelLimiter(limit)
    return found
