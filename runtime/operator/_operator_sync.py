"""``SyncOperator``: the operator API for code without an event loop (scripts, notebooks' cells
run outside one), over an ``Operator`` on a loop of its own.

Each method runs the ``Operator`` method of the same name to completion on that loop, so it
cannot be called from a running event loop (use ``Operator`` there). Errors are the ``Operator``'s.

The methods are not written twice: each is ``blocking(Operator.<name>)``, which takes the
``Operator`` method's signature, types and documentation (``watch``, a stream, is the one written
here); ``tests/unit/runtime/test_runtime_structure.py`` checks that every coroutine method of
``Operator`` has its twin here.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from stratagem.protocol import OPERATOR, PlanEvent
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._operator import Directory, Operator

__all__ = ["SyncOperator", "blocking"]

P = ParamSpec("P")
R = TypeVar("R")


class blocking(Generic[P, R]):
    """``SyncOperator``'s twin of the ``Operator`` coroutine method ``method``: the same
    parameters and result, run to completion on the ``SyncOperator``'s loop."""

    def __init__(self, method: Callable[Concatenate[Operator, P], Coroutine[Any, Any, R]]) -> None:
        self.method = method
        functools.update_wrapper(self, method)  # type: ignore[arg-type]  # its name and doc

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> blocking[P, R]: ...
    @overload
    def __get__(self, instance: SyncOperator, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(
        self, instance: SyncOperator | None, owner: type[Any]
    ) -> blocking[P, R] | Callable[P, R]:
        if instance is None:
            return self
        method, operator, runner = self.method, instance._operator, instance._runner

        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            return runner.run(method(operator, *args, **kwargs))

        # The bound method's name, doc and signature (without ``self``: ``__wrapped__``).
        functools.update_wrapper(run, getattr(operator, method.__name__))
        return run


class SyncOperator:
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

    endpoints = blocking(Operator.endpoints)
    call = blocking(Operator.call)
    health = blocking(Operator.health)
    describe = blocking(Operator.describe)
    history = blocking(Operator.history)
    plan = blocking(Operator.plan)
    traces = blocking(Operator.traces)
    plans = blocking(Operator.plans)
    show = blocking(Operator.show)
    owner = blocking(Operator.owner)
    revisions = blocking(Operator.revisions)
    replay = blocking(Operator.replay)
    run_plan = blocking(Operator.run_plan)
    research = blocking(Operator.research)
    submit = blocking(Operator.submit)
    start = blocking(Operator.start)
    worlds = blocking(Operator.worlds)
    world = blocking(Operator.world)
    reset_world = blocking(Operator.reset_world)
    control = blocking(Operator.control)
    approve = blocking(Operator.approve)
    fork = blocking(Operator.fork)
    reject = blocking(Operator.reject)
    pause = blocking(Operator.pause)
    cancel = blocking(Operator.cancel)
    resume = blocking(Operator.resume)
    replan = blocking(Operator.replan)


async def _next(stream: AsyncIterator[PlanEvent]) -> PlanEvent:
    return await anext(stream)
