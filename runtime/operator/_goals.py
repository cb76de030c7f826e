"""The operator's part for story goals: ``submit`` (a goal run to its end) and ``start`` (a goal
started, not waited for), over ``_goal``'s ``run_goal`` and ``start_goal``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from stratagem.protocol import InvalidArgumentError, PlanEvent, SubmitGoalRequest
from stratagem.runtime.operator._goal import (
    GoalOutcome,
    GoalStarted,
    goal_deadline_s,
    planning_timeouts,
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
                ``STRATAGEM_REQUEST_TIMEOUT_S`` plus each agent's ``planning_timeout_s`` for the
                requests a goal makes it plan (``goal_deadline_s``), as ``stratagem up``
                recorded them, else as the settings give them: no agent is asked.

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
        settings = self._link.settings
        planning = planning_timeouts(settings, self._link.roles)
        timeout_s = check_timeout(timeout)
        if timeout_s is None and not self._link.timeout_given:
            timeout_s = goal_deadline_s(settings.request_timeout_s, planning, goal)
        try:
            return await run_goal(
                endpoints,
                goal,
                timeout_s=timeout_s or self._link.config.default_timeout_s,
                on_event=on_event,
                credentials=self._link.credentials(),
                planners={r: "model" if s > 0 else "deterministic" for r, s in planning.items()},
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
