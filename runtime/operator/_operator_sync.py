"""``SyncOperator``: the operator API for code without an event loop (scripts, notebooks' cells
run outside one), over an ``Operator`` on a loop of its own.

Each method runs the ``Operator`` method of the same name to completion on that loop, so it
cannot be called from a running event loop (use ``Operator`` there). Errors are the ``Operator``'s.

The methods are not written twice: both classes take them from the one table of verbs,
``_operator.Verbs`` (``_compose.verb``), which gives ``SyncOperator`` each ``Operator`` method's
signature, types and documentation, its coroutine run on this class's loop (``watch``, a stream,
is the one written here); ``tests/unit/runtime/test_operator_verbs.py`` checks it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any

from stratagem.protocol import OPERATOR, PlanEvent
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._operator import Directory, Operator, Verbs

__all__ = ["SyncOperator"]


class SyncOperator(Verbs):
    """A deployment's agents, blocking: the methods of ``Operator``, each run to completion.

    Takes the arguments of ``Operator``. Use ``with SyncOperator() as op:`` or call ``close``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        address: str | None = None,
        profile: str | None = None,
        settings: Settings | None = None,
        caller: str = OPERATOR,
        timeout_s: float | None = None,
        endpoints: Mapping[str, str] | None = None,
        directory: Directory | None = None,
    ) -> None:
        self._operator = Operator(
            state_dir,
            address=address,
            profile=profile,
            settings=settings,
            caller=caller,
            timeout_s=timeout_s,
            endpoints=endpoints,
            directory=directory,
        )
        self._runner = asyncio.Runner()
        self._closed = False
        self._parts = self._operator._parts
        self._finish: Callable[[Coroutine[Any, Any, Any]], Any] = self._runner.run

    @property
    def settings(self) -> Settings:
        """The deployment's settings."""
        return self._operator.settings

    def __enter__(self) -> SyncOperator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel, let go of the directory and stop the loop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._operator.aclose())
        finally:
            self._runner.close()

    @property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role (see ``Operator.roles``)."""
        return self._operator.roles

    def watch(
        self,
        plan_id: str,
        *,
        owner: str | None = None,
        sub_plans: bool = True,
        wait_s: float = 0.0,
    ) -> Iterator[PlanEvent]:
        """See ``Operator.watch``: each event as an agent sends it, until the plan ends."""
        stream = self._operator.watch(plan_id, owner=owner, sub_plans=sub_plans, wait_s=wait_s)
        try:
            while True:
                try:
                    yield self._runner.run(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:  # else the loop, and the stream's channel with it, are gone
                self._runner.run(stream.aclose())


async def _next(stream: AsyncIterator[PlanEvent]) -> PlanEvent:
    return await anext(stream)
