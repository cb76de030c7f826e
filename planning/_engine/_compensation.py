"""Compensation: undoing the succeeded steps of a failed or cancelled plan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, assert_never

from stratagem.planning._engine._attempts import _Attempts, _classify, _Outcome, _Result
from stratagem.planning._engine._state import _RunState
from stratagem.planning._engine._types import ToolContext
from stratagem.planning._errors import LogicError
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    PlanStatus,
    Step,
    ToolStep,
)
from stratagem.planning._refs import has_refs, kind_of, resolve_refs
from stratagem.planning._store import CompensationStatus

logger = logging.getLogger(__name__)


class _Compensation:
    """Runs the compensations of a failed or cancelled run, through the attempt loop."""

    def __init__(
        self,
        state: _RunState[Any],
        attempts: _Attempts,
        *,
        seed: int,
        default_timeout: float,
    ) -> None:
        self.state = state
        self.attempts = attempts
        self.tools = attempts.tools
        self.agent = attempts.agent
        self.seed = seed
        self.default_timeout = default_timeout

    async def compensate(self, status: PlanStatus) -> None:
        """Run the compensations of the succeeded steps, newest first, best effort."""
        state = self.state
        todo = [
            step_id
            for step_id in reversed(state.compensable)
            if state.compensation.get(step_id)
            not in (CompensationStatus.COMPENSATED, CompensationStatus.FAILED)
        ]
        if not todo:
            return
        plan = state.plan
        message = f"compensating {len(todo)} step(s) of a {status.value} plan"
        logger.info("plan %s@%d: %s", plan.id, plan.revision, message)
        state.compensating_plan(message)
        for step_id in todo:
            await self._compensate_step(state.steps[step_id])

    async def _compensate_step(self, step: Step) -> None:
        state, step_id = self.state, step.id
        tool = step.compensate
        assert tool is not None  # only steps with a compensation are queued
        first = state.compensation_attempts.get(step_id, 0) + 1
        outcome = await self.attempts.retry(
            step, _CompensationTries(self, step, tool), first, first
        )
        attempt, failure_class, message = outcome.attempts, outcome.failure_class, outcome.message
        if failure_class is None:
            state.compensated(step_id, attempt)
            return
        logger.warning(
            "plan %s step %s: compensation %s failed (%s): %s",
            state.plan.id,
            step_id,
            tool,
            failure_class.value,
            message,
        )
        state.compensation_failed(step_id, attempt, failure_class, message)

    def input(self, step: Step) -> dict[str, Any]:
        """The compensating tool's input for ``step``."""
        outputs, inputs = self.state.outputs, self.state.plan.inputs
        if step.compensate_input is not None:
            value = resolve_refs(step.compensate_input, outputs, inputs)
        else:
            match step:
                case ToolStep():
                    base: dict[str, Any] = step.input
                case CrossAgentStep():
                    base = step.request
                case GateStep():
                    base = {}
                case _:
                    assert_never(step)
            resolved = resolve_refs(base, outputs, inputs) if has_refs(base) else base
            if not isinstance(resolved, dict):
                raise LogicError(f"the input resolves to {kind_of(resolved)}, not an object")
            value = {**resolved, "output": outputs.get(step.id)}
        if not isinstance(value, dict):
            raise LogicError(f"the compensation input resolves to {kind_of(value)}, not an object")
        return value


class _CompensationTries:
    """A compensation's attempts: each recorded ``running`` (durably) before its tool is called."""

    __slots__ = ("compensation", "limit", "step", "tool")

    def __init__(self, compensation: _Compensation, step: Step, tool: str) -> None:
        self.compensation = compensation
        self.step = step
        self.tool = tool
        self.limit = step.timeout_s or compensation.default_timeout

    def begin(self, attempt: int) -> Awaitable[None] | None:
        return self.compensation.state.compensating(self.step.id, attempt)

    async def once(self, step: Step, attempt: int, limit: float) -> _Result:
        compensation = self.compensation
        plan = compensation.state.plan
        try:
            tool_input = compensation.input(step)
            ctx = ToolContext(
                plan.id, step.id, attempt, compensation.agent, plan.revision, compensating=True
            )
            await compensation.attempts.limited(
                compensation.tools.run_tool(self.tool, tool_input, ctx), limit
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            return None, FailureClass.CANCELLED, "the compensation was cancelled"
        except Exception as exc:
            return None, *_classify(exc, limit)
        return None, None, ""

    def after(self, attempt: int, failure_class: FailureClass | None) -> Awaitable[None] | None:
        return None

    def retrying(
        self, attempt: int, failure_class: FailureClass, message: str, delay: float
    ) -> None:
        self.compensation.state.compensation_retrying(
            self.step.id, attempt, failure_class, message, delay
        )

    def advance(self, attempt: int) -> _Outcome | None:
        return None

    def seed(self) -> str:
        plan = self.compensation.state.plan
        return f"{self.compensation.seed}:compensate:{plan.id}@{plan.revision}:{self.step.id}"
