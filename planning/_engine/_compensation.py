"""Compensation: undoing the succeeded steps of a failed or cancelled plan.

What is undone, newest first, is whatever the state's ledger lists: steps, a map's items (by their
key, ``f"{step_id}.{index}"``, with the map's compensating tool) and the nested plans of sub-plan
and loop steps (each cancelled if unfinished, or its own succeeded steps compensated, by the
engine that runs it), so compensation runs in reverse order across expanded steps too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from stratagem.planning._engine._attempts import _Attempts, _classify, _Outcome, _Result
from stratagem.planning._engine._nested import _Nested
from stratagem.planning._engine._state import _RunState, key_owner
from stratagem.planning._engine._types import ToolContext
from stratagem.planning._errors import LogicError
from stratagem.planning._expr import expression, kind_of
from stratagem.planning._kinds import runs_items, runs_plans, step_kind
from stratagem.planning._plan import (
    FailureClass,
    PlanStatus,
    Step,
)
from stratagem.planning._refs import has_refs, resolve_refs
from stratagem.planning._store import CompensationStatus

logger = logging.getLogger(__name__)


class _Compensation:
    """Runs the compensations of a failed or cancelled run, through the attempt loop."""

    def __init__(
        self,
        state: _RunState[Any],
        attempts: _Attempts,
        nested: _Nested,
        *,
        seed: int,
        default_timeout: float,
    ) -> None:
        self.state = state
        self.attempts = attempts
        self.nested = nested
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
        for key in todo:
            owner = state.steps[key_owner(key)]
            if runs_plans(owner):
                await self._undo_nested(key, status)
            else:
                await self._compensate_step(owner, key)

    async def _undo_nested(self, key: str, status: PlanStatus) -> None:
        """Undo the nested plan of a sub-plan or a loop's iteration (``key``)."""
        state = self.state
        attempt = state.compensation_attempts.get(key, 0) + 1
        waiting = state.compensating(key, attempt)
        if waiting is not None:
            await waiting
        try:
            problem = await self.nested.compensate(key, status)
        except Exception as exc:  # a store failing, a bug: reported as this key's failure
            logger.exception("plan %s: undoing %s failed", state.plan.id, key)
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            state.compensation_failed(key, attempt, FailureClass.LOGIC, problem)
        else:
            state.compensated(key, attempt)

    async def _compensate_step(self, step: Step, key: str) -> None:
        state, step_id = self.state, key
        tool = step.compensate
        assert tool is not None  # only steps with a compensation are queued
        first = state.compensation_attempts.get(step_id, 0) + 1
        outcome = await self.attempts.retry(
            step, _CompensationTries(self, step, tool, key), first, first
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

    def input(self, step: Step, key: str) -> dict[str, Any]:
        """The compensating tool's input for ``step`` (its map item ``key``, for a map)."""
        outputs, inputs = self.state.outputs, self.state.plan.inputs
        bound, output = None, outputs.get(step.id)
        if key != step.id:  # a map's item: it reads its item, and its output is the item's
            bound, output = self._item(step, key)
        if step.compensate_input is not None:
            value = resolve_refs(step.compensate_input, outputs, inputs, bound)
        else:
            base = step_kind(step).sends(step)
            resolved = resolve_refs(base, outputs, inputs, bound) if has_refs(base) else base
            if not isinstance(resolved, dict):
                raise LogicError(f"the input resolves to {kind_of(resolved)}, not an object")
            value = {**resolved, "output": output}
        if not isinstance(value, dict):
            raise LogicError(f"the compensation input resolves to {kind_of(value)}, not an object")
        return value

    def _item(self, step: Step, key: str) -> tuple[dict[str, Any], Any]:
        """What the compensation of map item ``key`` reads: its ``item`` and ``index``, and its
        output (a resumed run that did not reach the map again re-evaluates its list)."""
        assert runs_items(step)
        state = self.state
        index = int(key.rpartition(".")[2])
        items = state.expansions.get(step.id)
        values = items.values if items is not None and items.values else None
        if values is None:
            values = expression(step.over).evaluate(state.outputs, state.plan.inputs)
        if not isinstance(values, list) or index >= len(values):
            raise LogicError(f"item {index} of map {step.id!r} cannot be found again")
        output = None if items is None else items.outputs.get(index)
        return {"item": values[index], "index": index}, output


class _CompensationTries:
    """A compensation's attempts: each recorded ``running`` (durably) before its tool is called."""

    __slots__ = ("compensation", "key", "limit", "step", "tool")

    def __init__(self, compensation: _Compensation, step: Step, tool: str, key: str) -> None:
        self.compensation = compensation
        self.step = step
        self.tool = tool
        self.key = key  # the step's id, or a map item's key
        self.limit = step.timeout_s or compensation.default_timeout

    def begin(self, attempt: int) -> Awaitable[None] | None:
        return self.compensation.state.compensating(self.key, attempt)

    async def once(self, step: Step, attempt: int, limit: float) -> _Result:
        compensation = self.compensation
        plan = compensation.state.plan
        try:
            tool_input = compensation.input(step, self.key)
            ctx = ToolContext(
                plan.id, self.key, attempt, compensation.agent, plan.revision, compensating=True
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
            self.key, attempt, failure_class, message, delay
        )

    def advance(self, attempt: int) -> _Outcome | None:
        return None

    def seed(self) -> str:
        plan = self.compensation.state.plan
        return f"{self.compensation.seed}:compensate:{plan.id}@{plan.revision}:{self.key}"
