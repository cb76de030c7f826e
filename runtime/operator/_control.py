"""The operator's part for plan control: ``control`` sends one action to the agent that owns a
plan, and each control verb (``approve``, ``reject``, ``pause``, ``cancel``, ``resume``,
``replan``, ``fork``) is ``control`` with its arguments named.

What the commands derive from each verb beside its method is ``_control_verbs.CONTROL_VERBS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from stratagem.protocol import ControlAction, ControlRequest, PlanSnapshot
from stratagem.runtime.operator._input import InputError, validation_line
from stratagem.runtime.operator._plans import Plans
from stratagem.runtime.operator._runs import PlanSource, Runs

__all__ = ["Control"]

_NO_VALUE: Any = object()
"""``approve``'s ``value`` when none is given (``None`` is JSON's null)."""


class Control:
    """Plan control: ``plans`` finds a plan's owner, ``runs`` checks a new revision's plan."""

    def __init__(self, plans: Plans, runs: Runs) -> None:
        self._plans = plans
        self._runs = runs

    async def control(
        self,
        plan_id: str,
        action: ControlAction,
        *,
        gate_id: str = "",
        rationale: str = "",
        output: Mapping[str, Any] | None = None,
        plan: PlanSource | None = None,
        value: Any = _NO_VALUE,
        arguments: Mapping[str, Any] | None = None,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Send one control action to the agent that owns ``plan_id``; the plan's state after it
        (for ``fork``, the new plan's).

        ``approve``, ``reject``, ``pause``, ``cancel``, ``resume``, ``replan`` and ``fork`` below
        are this with their arguments named.

        Raises:
            InputError: The arguments do not make a valid request (e.g. no rationale for a gate).
            PlanNotFoundError: No agent holds the plan.
            protocol.InvalidArgumentError: A value or arguments that do not fit the gate, a fork
                point that does not exist, an output for a step not before it.
            protocol.PermissionDeniedError: The gate is not for this caller.
            protocol.FailedPreconditionError: The action does not apply (a gate not open...).
        """
        plan_json = (
            "" if plan is None else (await self._runs.checked_plan(plan, plan_id=plan_id))[1]
        )
        recorded = None if output is None else dict(output)
        edited = None if arguments is None else dict(arguments)
        substituted = None if not outputs else {k: dict(v) for k, v in outputs.items()}
        given: dict[str, Any] = {} if value is _NO_VALUE else {"value": value}
        try:
            ControlRequest.build(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                output=recorded,
                plan_json=plan_json,
                arguments=edited,
                at_step=at_step,
                at_revision=at_revision,
                outputs=substituted,
                new_plan_id=new_plan_id,
                **given,
            )
        except ValidationError as exc:
            raise InputError(validation_line(f"{action} of plan {plan_id!r}", exc)) from exc
        except ValueError as exc:  # a value that is not JSON, named
            raise InputError(f"{action} of plan {plan_id!r}: {exc}") from exc
        return await self._plans.on_owner(
            plan_id,
            lambda client: client.control(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                output=recorded,
                plan_json=plan_json,
                arguments=edited,
                at_step=at_step,
                at_revision=at_revision,
                outputs=substituted,
                new_plan_id=new_plan_id,
                timeout=timeout,
                **given,
            ),
        )

    async def approve(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        output: Mapping[str, Any] | None = None,
        value: Any = _NO_VALUE,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Approve a gate: its plan goes on (a reconciled step is re-run, or ``output`` recorded
        as its result when its effect was found done). A gate that asks takes its ``value``; a
        tool's approval gate may take the tool's ``arguments`` as edited (the plan then goes on
        as a new revision whose author is this caller)."""
        return await self.control(
            plan_id,
            "approve",
            gate_id=gate_id,
            rationale=rationale,
            output=output,
            value=value,
            arguments=arguments,
            timeout=timeout,
        )

    async def reject(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Reject a gate: it (or the reconciled step) fails, and so its plan, compensated."""
        return await self.control(
            plan_id, "reject", gate_id=gate_id, rationale=rationale, timeout=timeout
        )

    async def pause(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Pause a plan: no new step starts, running ones finish; ``resume`` continues it."""
        return await self.control(plan_id, "pause", timeout=timeout)

    async def cancel(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Cancel a plan for good: running steps are cancelled, completed ones compensated."""
        return await self.control(plan_id, "cancel", timeout=timeout)

    async def resume(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Resume a stored, unfinished plan that is not running (paused, or left by a stop)."""
        return await self.control(plan_id, "resume", timeout=timeout)

    async def fork(
        self,
        plan_id: str,
        *,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
        rationale: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Fork a plan on its owner: a new plan (``new_plan_id``, or one the agent makes) whose
        steps before the fork point (``at_step`` of revision ``at_revision``; the end of the
        newest revision by default) carry their recorded results, ``outputs`` substituted for
        some, and which runs on from there; its snapshot as it starts (``forked_from`` in its
        plan JSON)."""
        return await self.control(
            plan_id,
            "fork",
            at_step=at_step,
            at_revision=at_revision,
            outputs=outputs,
            new_plan_id=new_plan_id,
            rationale=rationale,
            timeout=timeout,
        )

    async def replan(
        self,
        plan_id: str,
        plan: PlanSource,
        rationale: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Make a new revision of a stored plan that is not running (pause it first) from
        ``plan`` (its id replaced by ``plan_id``); ``resume`` runs it."""
        return await self.control(
            plan_id, "replan", rationale=rationale, plan=plan, timeout=timeout
        )
