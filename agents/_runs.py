"""The agent's runs in flight: which plans run here, and the tasks that carry them.

``PlanRuns`` is the one owner of that bookkeeping, shared by ``Agent`` (which serves requests)
and ``PlanControl`` (which steers made plans); both change it only through its methods:

- plans running for a waiting caller (``Agent._run``): ``serving`` marks one for its run;
- background tasks by plan id (a resumption, a cancellation settling, a fork's run):
  ``background`` starts one, its ``started`` event set once its run is live in the engine (so a
  control call waits with ``ready`` instead of racing the engine's own load of the plan); the
  entries go when the task ends;
- runs no caller's deadline binds (a detached request, ``plans run``): ``unbound``;
- the closing flag (``close``): while the agent stops, a call cancelled under a running plan
  interrupts it (resumable) instead of cancelling it (its caller is not gone; the agent is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeAlias

from stratagem.planning import PlanResult

__all__ = ["PlanRuns", "Starting"]

logger = logging.getLogger(__name__)

Starting: TypeAlias = Callable[[asyncio.Event], Coroutine[Any, Any, PlanResult[Any]]]
"""Makes a background task's coroutine, given the event it sets once its run is live."""


class PlanRuns:
    """The plans running on one agent and the tasks carrying them (their one writer).

    Args:
        role: The agent's role (named in the log when a background task fails).
    """

    def __init__(self, role: str) -> None:
        self._role = role
        self._serving: set[str] = set()
        self._tasks: dict[str, asyncio.Task[PlanResult[Any]]] = {}
        self._started: dict[str, asyncio.Event] = {}
        self._unbound: set[asyncio.Task[PlanResult[Any]]] = set()
        self._closing = False

    # --- reading -------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether the agent is stopping (``close``)."""
        return self._closing

    def is_serving(self, plan_id: str) -> bool:
        """Whether ``plan_id`` runs here for a waiting caller."""
        return plan_id in self._serving

    def task(self, plan_id: str) -> asyncio.Task[PlanResult[Any]] | None:
        """The background task carrying ``plan_id`` while it is not done (else ``None``)."""
        task = self._tasks.get(plan_id)
        return task if task is not None and not task.done() else None

    def is_active(self, plan_id: str) -> bool:
        """Whether ``plan_id`` runs here: for a caller, or in a background task."""
        return plan_id in self._serving or self.task(plan_id) is not None

    async def ready(self, plan_id: str) -> None:
        """Wait until a background task of ``plan_id`` (if any) has its run live in the engine."""
        started = self._started.get(plan_id)
        if self.task(plan_id) is not None and started is not None:
            await started.wait()

    # --- changing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def serving(self, plan_id: str) -> Iterator[None]:
        """Mark ``plan_id`` as running for a waiting caller while the block runs."""
        self._serving.add(plan_id)
        try:
            yield
        finally:
            self._serving.discard(plan_id)

    def background(
        self, plan_id: str, starting: Starting, *, name: str, live: bool = False
    ) -> asyncio.Task[PlanResult[Any]]:
        """Carry ``plan_id`` on in a background task of its own (the one already doing so, if
        any: a plan has one at a time), which a call for the plan meanwhile joins.

        Args:
            plan_id: The plan.
            starting: Makes the task's coroutine from the event to set once its run is live.
            name: The task's name.
            live: The run is live at once (a plan being cancelled: nothing to wait for).
        """
        task = self.task(plan_id)
        if task is not None:
            return task
        started = asyncio.Event()
        if live:
            started.set()
        task = asyncio.get_running_loop().create_task(starting(started), name=name)
        self._tasks[plan_id] = task
        self._started[plan_id] = started
        task.add_done_callback(self._ended)
        return task

    def unbound(
        self, run: Coroutine[Any, Any, PlanResult[Any]], plan_id: str
    ) -> asyncio.Task[PlanResult[Any]]:
        """``run`` in a task of its own, which no caller's cancellation reaches (``aclose``
        interrupts it; the plan stays resumable from the store)."""
        task = asyncio.get_running_loop().create_task(run, name=f"run {plan_id}")
        self._unbound.add(task)
        task.add_done_callback(self._unbound.discard)
        return task

    def close(self) -> None:
        """The agent is stopping: a plan whose call is cancelled from now on is interrupted (and
        resumed at the next start), not cancelled as one whose caller went away."""
        self._closing = True

    async def aclose(self) -> None:
        """Close, interrupt the unbound runs, then the background tasks (their plans stay
        resumable in the store), and wait for them."""
        self._closing = True
        runs = [task for task in self._unbound if not task.done()]
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        tasks = [task for task in self._tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _ended(self, task: asyncio.Task[PlanResult[Any]]) -> None:
        for plan_id, known in list(self._tasks.items()):
            if known is task:
                del self._tasks[plan_id]
                self._started.pop(plan_id, asyncio.Event()).set()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("agent %s: resuming %s failed: %s", self._role, task.get_name(), exc)
