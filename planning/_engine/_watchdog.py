"""One event-loop timer for every attempt deadline of a run."""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from typing import Any, Final

_CLOCK_RESOLUTION: Final = time.get_clock_info("monotonic").resolution


# Finished entries are dropped from the heap once they are at least this many and half of it.
_COMPACT_AT: Final = 64


class _Deadline:
    """One attempt's deadline, as the watchdog and the attempt share it (``task`` is dropped
    when the attempt ends: a finished entry waiting in the heap keeps nothing alive)."""

    __slots__ = ("cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task: asyncio.Task[Any] | None = task
        self.cancelling = task.cancelling()
        self.expired = False

    @property
    def active(self) -> bool:
        """Whether the attempt is still running (not ``disarm``ed)."""
        return self.task is not None


class _Watchdog:
    """Enforces every attempt deadline of one run with a single event-loop timer.

    ``asyncio.timeout`` costs a timer handle, a heap entry and a cancellation per attempt; on plans
    of short steps that was the largest part of the engine's per-step overhead. Here an attempt
    costs one entry in a heap of ``(when, seq, deadline)``; the timer is armed for the earliest
    entry, and when it fires it cancels the tasks of the expired, still active attempts. An attempt
    that ends ``disarm``s its entry, which lets go of its task; finished entries are dropped from
    the heap once they are half of it, so a run of many short steps under long limits holds about
    as many entries as attempts in flight, not one per attempt made (each with its task, coroutine
    and result, for the garbage collector to scan on every full collection).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._finished = 0  # entries in the heap whose attempt has ended

    def arm(self, task: asyncio.Task[Any], limit_s: float) -> _Deadline:
        """Cancel ``task`` in ``limit_s`` seconds unless the returned deadline is deactivated."""
        deadline = _Deadline(task)
        when = self._loop.time() + limit_s
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, deadline))
        if when < self._timer_at:
            self._schedule(when)
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        """The attempt ended: its entry lets go of the task and is dropped in time."""
        deadline.task = None
        if deadline.expired:
            return  # popped when it fired
        self._finished += 1
        heap = self._heap
        if self._finished >= _COMPACT_AT and 2 * self._finished >= len(heap):
            # Rebuilt in place of the old list: O(heap) once every half a heap of attempts.
            self._heap = [entry for entry in heap if entry[2].task is not None]
            heapq.heapify(self._heap)
            self._finished = 0

    def close(self) -> None:
        """Stop the timer (at the end of the run)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._heap.clear()
        self._finished = 0

    def _schedule(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self._loop.time() + _CLOCK_RESOLUTION  # the loop may run a timer this early
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline = heapq.heappop(heap)[2]
            if deadline.task is not None:
                deadline.expired = True
                deadline.task.cancel()
            else:
                self._finished -= 1
        if heap:
            self._schedule(heap[0][0])
