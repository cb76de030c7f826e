"""Compensation: undoing the succeeded steps of a failed or cancelled plan."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, TypeVar, assert_never

from stratagem.planning._engine._attempts import _Attempts, _classify
from stratagem.planning._engine._policy import Action
from stratagem.planning._engine._types import ToolContext, backoff_delay
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
        limit = step.timeout_s or self.default_timeout
        attempt = self.compensation_attempts.get(step_id, 0)
        first = attempt + 1
        rng: random.Random | None = None
        while True:
            attempt += 1
            self.compensation_attempts[step_id] = attempt
            self.statuses[step_id] = StepStatus.COMPENSATING
            self._emit(step_id, StepStatus.COMPENSATING, attempt)
            if self.journal is not None:
                await self.journal.write(
                    CompensationRecord(
                        plan.id, plan.revision, step_id, CompensationStatus.RUNNING, attempt
                    )
                )
            failure_class: FailureClass | None = None
            message = ""
            try:
                tool_input = self._compensation_input(step)
                ctx = ToolContext(
                    plan.id, step_id, attempt, self.agent, plan.revision, compensating=True
                )
                await self._limited(self.tools.run_tool(tool, tool_input, ctx), limit)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                failure_class, message = FailureClass.CANCELLED, "the compensation was cancelled"
            except Exception as exc:
                failure_class, message = _classify(exc, limit)
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
            tries = attempt - first + 1
            if self.policy.after_attempt(step, failure_class, tries) is Action.RETRY:
                if rng is None:
                    rng = random.Random(
                        f"{self.seed}:compensate:{plan.id}@{plan.revision}:{step_id}"
                    )
                delay = backoff_delay(step.retry, attempt - first + 1, rng)
                self._emit(
                    step_id,
                    StepStatus.COMPENSATING,
                    attempt,
                    failure_class,
                    f"{message}; retrying in {delay:.3f}s",
                    delay,
                )
                await self.sleep(delay)
                continue
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
            return

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
