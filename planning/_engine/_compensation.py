"""Compensation: undoing the succeeded steps of a failed or cancelled plan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar, assert_never

from stratagem.planning._engine._attempts import _Attempts, _classify, _Result
from stratagem.planning._engine._state import _Outcome
from stratagem.planning._engine._types import ToolContext
from stratagem.planning._errors import LogicError
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    Plan,
    PlanStatus,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._refs import has_refs, kind_of, resolve_refs
from stratagem.planning._store import CompensationRecord, CompensationStatus, PlanStatusRecord

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _Compensation(_Attempts[P]):
    async def _compensate(self, status: PlanStatus) -> None:
        """Run the compensations of the succeeded steps, newest first, best effort."""
        todo = [
            step_id
            for step_id in reversed(self.compensable)
            if self.compensation.get(step_id)
            not in (CompensationStatus.COMPENSATED, CompensationStatus.FAILED)
        ]
        if not todo:
            return
        plan = self.plan
        message = f"compensating {len(todo)} step(s) of a {status.value} plan"
        logger.info("plan %s@%d: %s", plan.id, plan.revision, message)
        self._record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.COMPENSATING, message))
        self._emit("", PlanStatus.COMPENSATING, 0, message=message)
        for step_id in todo:
            await self._compensate_step(self.steps[step_id])

    async def _compensate_step(self, step: Step) -> None:
        plan, step_id = self.plan, step.id
        tool = step.compensate
        assert tool is not None  # only steps with a compensation are queued
        first = self.compensation_attempts.get(step_id, 0) + 1
        outcome = await self._retry(step, _CompensationTries(self, step, tool), first, first)
        attempt, failure_class, message = outcome.attempts, outcome.failure_class, outcome.message
        if failure_class is None:
            self.compensation[step_id] = CompensationStatus.COMPENSATED
            self.statuses[step_id] = StepStatus.COMPENSATED
            self._record(
                CompensationRecord(
                    plan.id, plan.revision, step_id, CompensationStatus.COMPENSATED, attempt
                )
            )
            self._emit(step_id, StepStatus.COMPENSATED, attempt)
            return
        self.compensation[step_id] = CompensationStatus.FAILED
        self.statuses[step_id] = StepStatus.COMPENSATION_FAILED
        self._record(
            CompensationRecord(
                plan.id, plan.revision, step_id, CompensationStatus.FAILED, attempt, message
            )
        )
        logger.warning(
            "plan %s step %s: compensation %s failed (%s): %s",
            plan.id,
            step_id,
            tool,
            failure_class.value,
            message,
        )
        self._emit(step_id, StepStatus.COMPENSATION_FAILED, attempt, failure_class, message)

    def _compensation_input(self, step: Step) -> dict[str, Any]:
        if step.compensate_input is not None:
            value = resolve_refs(step.compensate_input, self.outputs)
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
            resolved = resolve_refs(base, self.outputs) if has_refs(base) else base
            if not isinstance(resolved, dict):
                raise LogicError(f"the input resolves to {kind_of(resolved)}, not an object")
            value = {**resolved, "output": self.outputs.get(step.id)}
        if not isinstance(value, dict):
            raise LogicError(f"the compensation input resolves to {kind_of(value)}, not an object")
        return value


class _CompensationTries:
    """A compensation's attempts: each recorded ``running`` (durably) before its tool is called."""

    __slots__ = ("limit", "run", "step", "tool")

    def __init__(self, run: _Compensation[Any], step: Step, tool: str) -> None:
        self.run = run
        self.step = step
        self.tool = tool
        self.limit = step.timeout_s or run.default_timeout

    def begin(self, attempt: int) -> Awaitable[None] | None:
        run, step_id = self.run, self.step.id
        run.compensation_attempts[step_id] = attempt
        run.statuses[step_id] = StepStatus.COMPENSATING
        run._emit(step_id, StepStatus.COMPENSATING, attempt)
        if run.journal is None:
            return None
        plan = run.plan
        return run.journal.write(
            CompensationRecord(plan.id, plan.revision, step_id, CompensationStatus.RUNNING, attempt)
        )

    async def once(self, step: Step, attempt: int, limit: float) -> _Result:
        run = self.run
        plan = run.plan
        try:
            tool_input = run._compensation_input(step)
            ctx = ToolContext(
                plan.id, step.id, attempt, run.agent, plan.revision, compensating=True
            )
            await run._limited(run.tools.run_tool(self.tool, tool_input, ctx), limit)
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
        self.run._emit(
            self.step.id,
            StepStatus.COMPENSATING,
            attempt,
            failure_class,
            f"{message}; retrying in {delay:.3f}s",
            delay,
        )

    def advance(self, attempt: int) -> _Outcome | None:
        return None

    def seed(self) -> str:
        plan = self.run.plan
        return f"{self.run.seed}:compensate:{plan.id}@{plan.revision}:{self.step.id}"
