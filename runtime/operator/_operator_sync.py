"""``SyncOperator``: the operator API for code without an event loop (scripts, notebooks' cells
run outside one), over an ``Operator`` on a loop of its own.

Each method runs the ``Operator`` method of the same name to completion on that loop, so it
cannot be called from a running event loop (use ``Operator`` there). Errors are the ``Operator``'s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from stratagem.protocol import (
    OPERATOR,
    AgentCard,
    ControlAction,
    ListWorldsResponse,
    PlanEvent,
    PlanSnapshot,
    ReplayResult,
    ResetWorldResponse,
    RevisionsResponse,
    ShowWorldResponse,
    SubmitGoalRequest,
    WireModel,
)
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._goal import GoalOutcome, GoalStarted
from stratagem.runtime.operator._history import (
    DEFAULT_HISTORY_PAGE,
    HistoryPage,
    PlanHistory,
    PlanView,
    TraceSummary,
)
from stratagem.runtime.operator._operator import Directory, Operator, PlanSource

__all__ = ["SyncOperator"]


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

    def endpoints(self) -> dict[str, str]:
        """Each agent's endpoint (see ``Operator.endpoints``)."""
        return self._runner.run(self._operator.endpoints())

    def call(
        self,
        agent: str,
        capability: str,
        payload: Mapping[str, Any] | WireModel | None = None,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> WireModel:
        """See ``Operator.call``."""
        return self._runner.run(
            self._operator.call(agent, capability, payload, timeout=timeout, request_id=request_id)
        )

    def health(self, agent: str) -> str:
        """See ``Operator.health``."""
        return self._runner.run(self._operator.health(agent))

    def describe(self, agent: str) -> AgentCard:
        """See ``Operator.describe``."""
        return self._runner.run(self._operator.describe(agent))

    def history(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        goal: str | None = None,
        text: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        trace_id: str | None = None,
        plan_id: str | None = None,
        page_size: int = DEFAULT_HISTORY_PAGE,
        page_token: str = "",
        top_level: bool = False,
    ) -> HistoryPage:
        """See ``Operator.history``."""
        return self._runner.run(
            self._operator.history(
                agent=agent,
                status=status,
                goal=goal,
                text=text,
                since=since,
                until=until,
                trace_id=trace_id,
                plan_id=plan_id,
                page_size=page_size,
                page_token=page_token,
                top_level=top_level,
            )
        )

    def plan(self, plan_id: str, *, full: bool = False) -> PlanHistory:
        """See ``Operator.plan``."""
        return self._runner.run(self._operator.plan(plan_id, full=full))

    def traces(self, *, limit: int = 20) -> list[TraceSummary]:
        """See ``Operator.traces``."""
        return self._runner.run(self._operator.traces(limit=limit))

    def plans(self, *, agent: str | None = None, status: str | None = None) -> list[PlanView]:
        """See ``Operator.plans``."""
        return self._runner.run(self._operator.plans(agent=agent, status=status))

    def show(self, plan_id: str) -> list[PlanView]:
        """See ``Operator.show``."""
        return self._runner.run(self._operator.show(plan_id))

    def owner(self, plan_id: str) -> str:
        """See ``Operator.owner``."""
        return self._runner.run(self._operator.owner(plan_id))

    def revisions(self, plan_id: str) -> RevisionsResponse:
        """See ``Operator.revisions``."""
        return self._runner.run(self._operator.revisions(plan_id))

    def replay(self, plan_id: str, *, timeout: float | None = None) -> ReplayResult:
        """See ``Operator.replay``."""
        return self._runner.run(self._operator.replay(plan_id, timeout=timeout))

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

    def run_plan(
        self, plan: PlanSource, *, timeout: float | None = None, until_blocked: bool = False
    ) -> PlanView:
        """See ``Operator.run_plan``."""
        return self._runner.run(
            self._operator.run_plan(plan, timeout=timeout, until_blocked=until_blocked)
        )

    def submit(
        self,
        goal: SubmitGoalRequest | Mapping[str, Any],
        *,
        timeout: float | None = None,
        on_event: Callable[[PlanEvent], None] | None = None,
    ) -> GoalOutcome:
        """See ``Operator.submit``."""
        return self._runner.run(self._operator.submit(goal, timeout=timeout, on_event=on_event))

    def start(
        self, goal: SubmitGoalRequest | Mapping[str, Any], *, timeout: float | None = None
    ) -> GoalStarted:
        """See ``Operator.start``."""
        return self._runner.run(self._operator.start(goal, timeout=timeout))

    def worlds(self, *, prefix: str = "") -> ListWorldsResponse:
        """See ``Operator.worlds``."""
        return self._runner.run(self._operator.worlds(prefix=prefix))

    def world(self, world: str) -> ShowWorldResponse:
        """See ``Operator.world``."""
        return self._runner.run(self._operator.world(world))

    def reset_world(self, world: str) -> ResetWorldResponse:
        """See ``Operator.reset_world``."""
        return self._runner.run(self._operator.reset_world(world))

    def control(
        self,
        plan_id: str,
        action: ControlAction,
        *,
        gate_id: str = "",
        rationale: str = "",
        output: Mapping[str, Any] | None = None,
        plan: PlanSource | None = None,
        timeout: float | None = None,
        **more: Any,
    ) -> PlanSnapshot:
        """See ``Operator.control`` (``more``: its ``value``, ``arguments`` and fork fields)."""
        return self._runner.run(
            self._operator.control(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                output=output,
                plan=plan,
                timeout=timeout,
                **more,
            )
        )

    def approve(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        output: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **more: Any,
    ) -> PlanSnapshot:
        """See ``Operator.approve`` (``more``: its ``value`` and ``arguments``)."""
        return self._runner.run(
            self._operator.approve(
                plan_id, gate_id, rationale, output=output, timeout=timeout, **more
            )
        )

    def fork(
        self,
        plan_id: str,
        *,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
        rationale: str = "",
        timeout: float | None = None,
    ) -> PlanSnapshot:
        """See ``Operator.fork``."""
        return self._runner.run(
            self._operator.fork(
                plan_id,
                at_step=at_step,
                at_revision=at_revision,
                outputs=outputs,
                new_plan_id=new_plan_id,
                rationale=rationale,
                timeout=timeout,
            )
        )

    def reject(
        self, plan_id: str, gate_id: str, rationale: str, *, timeout: float | None = None
    ) -> PlanSnapshot:
        """See ``Operator.reject``."""
        return self._runner.run(self._operator.reject(plan_id, gate_id, rationale, timeout=timeout))

    def pause(self, plan_id: str, *, timeout: float | None = None) -> PlanSnapshot:
        """See ``Operator.pause``."""
        return self._runner.run(self._operator.pause(plan_id, timeout=timeout))

    def cancel(self, plan_id: str, *, timeout: float | None = None) -> PlanSnapshot:
        """See ``Operator.cancel``."""
        return self._runner.run(self._operator.cancel(plan_id, timeout=timeout))

    def resume(self, plan_id: str, *, timeout: float | None = None) -> PlanSnapshot:
        """See ``Operator.resume``."""
        return self._runner.run(self._operator.resume(plan_id, timeout=timeout))

    def replan(
        self, plan_id: str, plan: PlanSource, rationale: str, *, timeout: float | None = None
    ) -> PlanSnapshot:
        """See ``Operator.replan``."""
        return self._runner.run(self._operator.replan(plan_id, plan, rationale, timeout=timeout))


async def _next(stream: AsyncIterator[PlanEvent]) -> PlanEvent:
    return await anext(stream)
