"""The operator's part for story goals: ``submit`` (a goal run to its end) and ``start`` (a goal
started, not waited for), over ``_goal``'s ``run_goal`` and ``start_goal``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from stratagem.protocol import (
    AgentCard,
    InvalidArgumentError,
    PlanEvent,
    ProtocolError,
    SubmitGoalRequest,
)
from stratagem.runtime.operator._goal import (
    GoalOutcome,
    GoalStarted,
    goal_deadline_s,
    run_goal,
    start_goal,
)
from stratagem.runtime.operator._input import InputError, check_timeout, validation_line
from stratagem.runtime.operator._link import Link

__all__ = ["Goals"]


class Goals:
    """Story goals, through ``link``."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def submit(
        self,
        goal: SubmitGoalRequest | Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline for the whole goal)
        on_event: Callable[[PlanEvent], None] | None = None,
    ) -> GoalOutcome:
        """Pursue a story goal across all agents (``goal``, ``passage``, ``beats``); returns the
        orchestrator's answer, every agent's plans (an extension's agents' too) and the trace id.

        Args:
            goal: The goal, or the mapping a goal file holds.
            timeout: The whole goal's deadline; by default (and when the operator was made
                without ``timeout_s``) one that fits the deployment's planners:
                ``STRATAGEM_REQUEST_TIMEOUT_S`` plus the planning limits each agent's card states
                for the requests a goal makes it plan (``goal_deadline_s``).

        Raises:
            InputError: The goal is not valid, or the orchestrator refused it as such
                (``INVALID_ARGUMENT``: it consults an external agent the orchestrator does not
                know, ...), before anything ran.
            protocol.DeadlineExceededError: The deadline passed; the message says where the goal
                was waiting and how to give it longer.
        """
        if not isinstance(goal, SubmitGoalRequest):
            try:
                goal = SubmitGoalRequest.model_validate(dict(goal))
            except ValidationError as exc:
                raise InputError(validation_line("goal", exc)) from exc
        endpoints = await self._link.endpoints()
        timeout_s = check_timeout(timeout)
        if timeout_s is None and not self._link.timeout_given:
            timeout_s = goal_deadline_s(
                self._link.settings.request_timeout_s, await self._cards(endpoints), goal
            )
        try:
            return await run_goal(
                endpoints,
                goal,
                timeout_s=timeout_s or self._link.config.default_timeout_s,
                on_event=on_event,
                credentials=self._link.credentials(),
            )
        except InvalidArgumentError as exc:
            raise InputError(f"goal refused: {exc.message}") from exc

    async def start(
        self,
        goal: SubmitGoalRequest | Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline for the whole goal)
    ) -> GoalStarted:
        """Start a story goal and return as soon as the orchestrator runs it (what ``submit
        --detach`` does): its plan id and trace id. The goal runs on without this caller;
        ``watch``, ``plan`` and ``history`` follow it.

        Raises:
            InputError: A goal its model refuses.
            protocol.RemoteError: The orchestrator refused the goal before it started.
        """
        if not isinstance(goal, SubmitGoalRequest):
            try:
                goal = SubmitGoalRequest.model_validate(dict(goal))
            except ValidationError as exc:
                raise InputError(validation_line("goal", exc)) from exc
        endpoints = await self._link.endpoints(("orchestrator",))
        return await start_goal(
            endpoints["orchestrator"],
            goal,
            timeout_s=check_timeout(timeout) or self._link.config.default_timeout_s,
            credentials=self._link.credentials(),
        )

    async def _cards(self, endpoints: Mapping[str, str]) -> dict[str, AgentCard]:
        """Each agent's card, as far as it answers within a few seconds (a goal's deadline then
        follows how the agents plan)."""

        async def card(role: str) -> tuple[str, AgentCard | None]:
            try:
                return role, await self._link.client(endpoints[role]).describe(timeout=5.0)
            except ProtocolError:
                return role, None

        found = await asyncio.gather(*(card(role) for role in endpoints))
        return {role: got for role, got in found if got is not None}
