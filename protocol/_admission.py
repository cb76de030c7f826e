"""How much one call may take: a slot among the server's concurrent calls, and time.

``Admission`` bounds the calls running at once and the calls waiting for a slot; ``Budget`` and
``within`` run a handler under the call's remaining deadline; ``interruption`` tells why the
transport cancelled a call.
"""

from __future__ import annotations

import asyncio
import collections
import types
from collections.abc import Awaitable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from stratagem.protocol._errors import (
    CancelledError,
    DeadlineExceededError,
    ProtocolUsageError,
    RemoteError,
    ResourceExhaustedError,
)

__all__ = ["Admission", "Budget", "deadline_passed", "interruption", "uninterrupted", "within"]

T = TypeVar("T")


class Admission:
    """At most ``limit`` calls run at once and ``queue`` wait; the rest are refused at once.

    Waiters are served first come, first served; a waiter whose call is cancelled (its deadline
    passed, its caller went away) leaves the queue.
    """

    def __init__(self, limit: int, queue: int) -> None:
        self._limit = limit
        self._queue = queue
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, role: str) -> None:
        if self.running < self._limit and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self._queue:
            raise ResourceExhaustedError(
                f"{role} is at its limit ({self.running} requests running, "
                f"{len(self._waiters)} queued); retry later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as this call was cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Hand the slot to the first live waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1


@dataclass(frozen=True, slots=True)
class Budget:
    """How long a call may run, and how much later than that our own timer fires.

    When the client sent a deadline, the transport cancels the call as it passes and our timer is
    only a backstop, set a little later so the two never race to answer the same call.
    """

    seconds: float
    backstop: float


async def within(budget: Budget, awaitable: Awaitable[T], what: str) -> T:
    """Await ``awaitable`` within ``budget`` (``DeadlineExceededError`` after).

    ``asyncio.timeout`` without its context-manager objects: one timer that cancels this task,
    and the same rule to tell our own cancellation from anyone else's (``uncancel``).
    """
    task = asyncio.current_task()
    if task is None:
        raise ProtocolUsageError("within needs a running task")
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    cancelling = task.cancelling()
    timer = asyncio.get_running_loop().call_later(budget.seconds + budget.backstop, expire)
    try:
        result = await awaitable
    except asyncio.CancelledError:
        timer.cancel()
        if expired and task.uncancel() <= cancelling:
            raise DeadlineExceededError(
                f"{what} did not finish within {budget.seconds:.3g}s"
            ) from None
        raise
    except BaseException:
        timer.cancel()
        if expired:
            task.uncancel()
        raise
    timer.cancel()
    if expired:
        task.uncancel()
    return result


def deadline_passed(context: Any) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def interruption(context: Any) -> RemoteError:
    """Why the transport cancelled a call: its deadline passed, or its caller went away."""
    if deadline_passed(context):
        return DeadlineExceededError("the deadline passed")
    return CancelledError("cancelled by the caller")


async def uninterrupted(coro: Coroutine[Any, Any, T]) -> T:
    """``await asyncio.shield(coro)``, without a task when ``coro`` finishes without suspending.

    ``coro`` runs at once, in this task; only if it suspends does the rest of it go to a task of
    its own, shielded, so a cancellation of this task no longer reaches it (it then finishes on
    its own). A store whose write completes on the spot (the usual case) costs neither a task nor
    a turn of the event loop.
    """
    try:
        suspended_on = coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    except BaseException:
        coro.close()
        raise
    return await asyncio.shield(asyncio.ensure_future(_resume(coro, suspended_on)))


@types.coroutine
def _yield(item: Any) -> Generator[Any, None, None]:
    """Hand what a coroutine yielded (a future, or ``None`` for a bare yield) to the running task,
    as the coroutine itself would have."""
    yield item


async def _resume(coro: Coroutine[Any, Any, T], suspended_on: Any) -> T:
    """Run the rest of a coroutine ``uninterrupted`` started, in the task awaiting this."""
    while True:
        try:
            await _yield(suspended_on)
        except BaseException as exc:  # the future failed, or this task was cancelled
            try:
                suspended_on = coro.throw(exc)
            except StopIteration as done:
                result: T = done.value
                return result
            continue
        try:
            suspended_on = coro.send(None)
        except StopIteration as done:
            result = done.value
            return result
