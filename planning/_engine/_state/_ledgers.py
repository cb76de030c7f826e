"""The ledgers of the step kinds that expand (a map's items, a loop's or a sub-plan's
iterations), the priority ready queue, and the keys of what a step expands into.

Values the run's state (``_core._RunState``) holds; only this package changes them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stratagem.planning._plan import Plan


def expansion_key(step_id: str, index: int) -> str:
    """The key of a map's item (from 0) or a loop's iteration (from 1): ``f"{step_id}.{index}"``.

    Step ids have no dots, so a key never names a step; it keys the item's (or the iteration's)
    journal records and compensation, and makes the item's idempotency key.
    """
    return f"{step_id}.{index}"


def key_owner(key: str) -> str:
    """The step an expansion key belongs to (the key itself when it is a step id)."""
    return key.partition(".")[0]


@dataclass(slots=True)
class _Items:
    """A map step's items: the list it maps and the outputs of the items that succeeded.

    Attributes:
        values: The items.
        outputs: Item index -> output, for the items that succeeded.
        attempts: Item index -> its latest attempt.
    """

    values: list[Any]
    outputs: dict[int, Any] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Iterations:
    """A loop step's (or a sub-plan step's) iterations.

    Attributes:
        started_at: When the first iteration started (``time.time()``), for the timebox.
        current: The latest iteration started (0 before the first).
        ended: The latest iteration that ended (0 before the first ended).
        last: The outputs of the latest iteration that ended, by step id.
        holds: Whether ``until`` held after the latest iteration that ended.
        failed: Whether the latest iteration that ended failed.
        attempts: A loop's iteration -> its latest attempt, for an iteration retried (its
            ``retry``); absent: its first.
    """

    started_at: float | None = None
    current: int = 0
    ended: int = 0
    last: dict[str, Any] | None = None
    holds: bool = False
    failed: bool = False
    attempts: dict[int, int] = field(default_factory=dict)

    def start(self, iteration: int) -> None:
        """Iteration ``iteration`` starts; the one that just failed starts its next attempt."""
        if iteration == self.ended and self.failed:
            self.attempts[iteration] = self.attempts.get(iteration, 1) + 1
            self.ended, self.failed, self.holds, self.last = iteration - 1, False, False, None
        self.current = iteration


class _Ready:
    """The ready queue of a plan whose steps have priorities: higher first, then plan order.

    The same operations as the ``deque`` the other plans use.
    """

    __slots__ = ("_first", "_heap", "_order", "_priority")

    def __init__(self, plan: Plan) -> None:
        self._priority = {step.id: -step.priority for step in plan.steps}
        self._order = {step.id: n for n, step in enumerate(plan.steps)}
        self._heap: list[tuple[int, int, str]] = []
        self._first = 0  # ``appendleft`` puts a step before every other of its priority

    def append(self, step_id: str) -> None:
        heapq.heappush(self._heap, (self._priority[step_id], self._order[step_id], step_id))

    def extend(self, step_ids: Iterable[str]) -> None:
        for step_id in step_ids:
            self.append(step_id)

    def appendleft(self, step_id: str) -> None:
        self._first -= 1
        heapq.heappush(self._heap, (self._priority[step_id], self._first, step_id))

    def popleft(self) -> str:
        return heapq.heappop(self._heap)[2]

    def __getitem__(self, index: int) -> str:
        if index != 0:
            raise IndexError("only the first ready step can be read")
        return self._heap[0][2]

    def __iter__(self) -> Iterator[str]:
        return (entry[2] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
