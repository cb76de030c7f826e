"""Loops and sub-plans: a step that runs a nested plan of the same agent and waits for it.

``_Nested`` runs a sub-plan step's nested plan once, and a loop step's body once per iteration
until ``until`` holds or a bound is reached. Each nested plan is a plan of its own (its steps,
journal, events, control), run by the engine that runs this one (``Children``); the state journals
each iteration's start and end here (``IterationRecord``: the decision of ``until`` and what the
nested plan spent, charged to this plan's budget in the same commit). A resumed run continues an
iteration that had started (its nested plan resumes from its own journal) and never repeats one
that had ended.

The step's own ``timeout_s`` (a timebox over the whole step) and a sub-plan's ``retry`` (the
whole nested plan again) are honoured here too, and only here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final

from pydantic import ValidationError

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._engine._attempts import _Outcome
from stratagem.planning._engine._deps import Children, ChildResult
from stratagem.planning._engine._policy import Action, FailurePolicy, _Admission, backoff_delay
from stratagem.planning._engine._state import _loop as loop_ledger
from stratagem.planning._engine._state import _RunState, expansion_key, key_owner
from stratagem.planning._errors import PlanningError
from stratagem.planning._expr import expression, truthy
from stratagem.planning._plan import (
    LOOP_ITERATION,
    LOOP_LAST,
    FailureClass,
    LoopStep,
    Plan,
    PlanStatus,
    SubplanStep,
)
from stratagem.planning._refs import resolve_refs
from stratagem.planning._store._state import IterationOutcome

logger = logging.getLogger(__name__)

# The longest value of ``until`` quoted in an iteration's event.
_SHOWN: Final = 200


def child_id(plan: Plan, step_id: str, iteration: int | None) -> str:
    """The id of the nested plan of ``step_id`` (its ``iteration``, for a loop) in ``plan``:
    ``f"{plan.id}/{step_id}"`` (``.r{revision}`` after the first revision; ``.{iteration}``)."""
    base = f"{plan.id}/{step_id}"
    if plan.revision != 1:
        base += f".r{plan.revision}"
    return base if iteration is None else f"{base}.{iteration}"


def nested_plan_id(plan: Plan, step: LoopStep | SubplanStep, index: int, attempt: int = 1) -> str:
    """The id of the nested plan of ``step``'s iteration ``index`` (its ``attempt``) in ``plan``;
    a sub-plan's attempts are its iterations: ``.a{index}`` from the second."""
    if isinstance(step, LoopStep):
        base = child_id(plan, step.id, index)
        return base if attempt == 1 else f"{base}.a{attempt}"
    base = child_id(plan, step.id, None)
    return base if index == 1 else f"{base}.a{index}"


class _Nested:
    """Runs loop and sub-plan steps through the engine's ``Children``.

    Both honour the step's ``timeout_s`` here (``_timeboxed``: a timebox over the whole step)
    and a sub-plan its ``retry`` (``_subplan``: the whole nested plan again, attempt ``n`` a new
    nested plan). A sub-plan's attempts are recorded as its "iterations" (attempt ``n`` is
    iteration ``n`` of the journal), so a restart finds the attempt that was running.
    """

    def __init__(
        self,
        state: _RunState[Any],
        children: Children,
        admission: _Admission,
        clock: Callable[[], float],
        policy: FailurePolicy,
        sleep: Callable[[float], Awaitable[object]],
    ) -> None:
        self.state = state
        self.children = children
        self.admission = admission
        self.clock = clock
        self.policy = policy
        self.sleep = sleep
        self.handles: dict[str, object] = {}  # without a store: key -> the nested run

    def plan_id_of(self, step: LoopStep | SubplanStep, index: int) -> str:
        """The id of the nested plan of ``step``'s iteration (a sub-plan's attempt) ``index``."""
        found = self.state.iterations.get(step.id)
        attempt = 1 if found is None else found.attempts.get(index, 1)
        return nested_plan_id(self.state.plan, step, index, attempt)

    def nested_id(self, key: str) -> str:
        """The id of the nested plan an expansion key (``f"{step_id}.{iteration}"``) names."""
        step = self.state.steps[key_owner(key)]
        assert isinstance(step, LoopStep | SubplanStep)
        return self.plan_id_of(step, int(key.rpartition(".")[2]))

    async def compensate(self, key: str, status: PlanStatus) -> str:
        """Undo the nested plan ``key`` names (this plan ended ``status``); why it failed, or ""."""
        return await self.children.compensate(self.nested_id(key), self.handles.get(key), status)

    async def resume_outputs(self, step_id: str, iteration: int) -> None:
        """A resumed run reads the outputs of the latest ended iteration of loop ``step_id``."""
        step = self.state.steps[step_id]
        assert isinstance(step, LoopStep | SubplanStep)
        outputs = await self.children.outputs(self.plan_id_of(step, iteration))
        loop_ledger.load_iteration_outputs(self.state, step_id, outputs)

    async def run(self, step: LoopStep | SubplanStep, attempt: int) -> _Outcome:
        """Run ``step``'s nested plan (each iteration, for a loop); the step's outcome."""
        state = self.state
        plan = state.plan
        try:
            inputs = resolve_refs(step.inputs, state.outputs, plan.inputs)
        except PlanningError as exc:
            return _failed(f"its inputs cannot be resolved: {exc}")
        if not isinstance(inputs, dict):
            return _failed("its inputs do not resolve to an object")
        if step.timeout_s is not None:
            return await self._timeboxed(step, inputs, step.timeout_s)
        if isinstance(step, SubplanStep):
            return await self._subplan(step, inputs)
        return await self._loop(step, inputs)

    async def _timeboxed(
        self, step: LoopStep | SubplanStep, inputs: dict[str, Any], limit_s: float
    ) -> _Outcome:
        """Run ``step`` within ``timeout_s`` from its first start (the journaled start of its
        first iteration or attempt, so a resumed run keeps the timebox it had); on expiry the
        running nested plan is cancelled (it compensates itself) and the step fails ``timeout``."""
        found = self.state.iterations.get(step.id)
        started_at = found.started_at if found is not None else None
        left = limit_s if started_at is None else limit_s - (self.clock() - started_at)
        timebox = asyncio.timeout(max(left, 0.0))
        try:
            async with timebox:
                if isinstance(step, SubplanStep):
                    return await self._subplan(step, inputs)
                return await self._loop(step, inputs)
        except TimeoutError:
            if not timebox.expired():
                raise
        return await self._expired(step, inputs, limit_s)

    async def _expired(
        self, step: LoopStep | SubplanStep, inputs: dict[str, Any], limit_s: float
    ) -> _Outcome:
        """``step``'s timebox expired: cancel its running nested plan, record how it ended, and
        fail the step (class ``timeout``)."""
        reason = f"it timed out after {limit_s:g}s (timeout_s)"
        found = self.state.iterations.get(step.id)
        attempts = 1 if found is None else max(found.current, 1)
        if found is None or found.current <= found.ended:
            return _Outcome(None, FailureClass.TIMEOUT, reason, attempts)
        index = found.current
        key = expansion_key(step.id, index)
        problem = await self.compensate(key, PlanStatus.FAILED)
        if problem:
            reason += f"; {problem}"
        if key in self.handles:  # without a store: nothing to read back
            self._ended(step, index, "failed", "null", ChildResult(PlanStatus.CANCELLED, {}))
        else:  # the nested plan ended cancelled: its record (and what it spent) read back
            body = inputs
            if isinstance(step, LoopStep):
                body = {**inputs, LOOP_ITERATION: index, LOOP_LAST: found.last}
            result = await self._child(step, index, body)
            if not isinstance(result, _Outcome):
                self._ended(step, index, "failed", "null", result)
        logger.info("plan %s step %s: %s", self.state.plan.id, step.id, reason)
        return _Outcome(None, FailureClass.TIMEOUT, reason, attempts)

    async def _subplan(self, step: SubplanStep, inputs: dict[str, Any]) -> _Outcome:
        """Attempt ``step``'s nested plan, again after a failure its ``retry`` retries."""
        state = self.state
        found = state.iterations.get(step.id)
        index = 1 if found is None or found.current == 0 else found.current
        while True:
            ended = found is not None and found.ended == index  # charged already: read it back
            if not ended:
                resumed = found is not None and found.current == index
                loop_ledger.iteration_started(state, step.id, index, self.clock(), recorded=resumed)
            result = await self._child(step, index, inputs)
            if isinstance(result, _Outcome):
                return result
            if result.status is PlanStatus.SUCCEEDED:
                if not ended:
                    self._ended(step, index, "held", "null", result)
                return _Outcome(dict(result.outputs), None, "", index)
            outcome = self._child_failed(step, index, result, charge=not ended)
            if not await self._retried(step, index, outcome):
                return outcome
            index += 1
            found = None

    async def _retried(self, step: LoopStep | SubplanStep, tries: int, outcome: _Outcome) -> bool:
        """The nested plan (a sub-plan's, or a loop's iteration's) failed after ``tries`` attempts
        with ``outcome``: whether the step's ``retry`` runs it again, once its backoff is over (the
        retry journaled first). ``outcome.attempts`` becomes the step's attempts either way."""
        state = self.state
        attempt = state.attempts.get(step.id, 1)
        outcome.attempts = attempt
        failure_class = outcome.failure_class
        assert failure_class is not None
        if self.policy.after_attempt(step, failure_class, tries) is not Action.RETRY:
            return False
        plan = state.plan
        rng = random.Random(f"{step_run_id(plan.id, plan.revision, step.id)}:{attempt}")
        delay = backoff_delay(step.retry, tries, rng)
        state.retrying(step.id, attempt, failure_class, outcome.message, delay)
        await self.sleep(delay)
        state.start(step.id, attempt + 1)
        return True

    async def _loop(self, step: LoopStep, inputs: dict[str, Any]) -> _Outcome:
        state = self.state
        found = state.iterations.get(step.id)
        iteration, last, started_at = 1, None, None
        resuming = False
        if found is not None:
            if found.ended and found.last is None:
                await self.resume_outputs(step.id, found.ended)
            if found.ended and found.holds:
                return _done(found.ended, True, found.last)
            started_at = found.started_at
            last = found.last
            resuming = found.current > found.ended
            iteration = found.current if resuming else found.ended + 1
            if found.failed:  # it failed before the step's failure was recorded: read it back
                iteration = found.ended
                ended = await self._child(
                    step, iteration, {**inputs, LOOP_ITERATION: iteration, LOOP_LAST: None}
                )
                if isinstance(ended, _Outcome):
                    return ended
                failure = self._child_failed(step, iteration, ended, charge=False)
                if not await self._retried(step, found.attempts.get(iteration, 1), failure):
                    return failure
                last = None
                if iteration > 1:  # the retried iteration reads the one before it as ``last``
                    previous = self.plan_id_of(step, iteration - 1)
                    last = await self.children.outputs(previous)
        until = None if step.until is None else expression(step.until)
        while True:
            if not resuming:
                if step.max_iterations is not None and iteration > step.max_iterations:
                    return self._exhausted(step, iteration - 1, last, "max_iterations")
                if (
                    step.timebox_s is not None
                    and started_at is not None
                    and self.clock() - started_at >= step.timebox_s
                ):
                    return self._exhausted(step, iteration - 1, last, "timebox_s")
            now = self.clock()
            loop_ledger.iteration_started(state, step.id, iteration, now, recorded=resuming)
            resuming = False
            if started_at is None:
                started_at = now
            body_inputs = {**inputs, LOOP_ITERATION: iteration, LOOP_LAST: last}
            result = await self._child(step, iteration, body_inputs)
            if isinstance(result, _Outcome):
                return result
            if result.status is not PlanStatus.SUCCEEDED:
                failure = self._child_failed(step, iteration, result)
                tries = state.iterations[step.id].attempts.get(iteration, 1)
                if not await self._retried(step, tries, failure):
                    return failure
                continue  # the same iteration again: its next attempt
            holds, value_json = False, "null"
            if until is not None:
                try:
                    value = until.evaluate(result.outputs, body_inputs)
                except PlanningError as exc:
                    self._ended(step, iteration, "failed", "null", result)
                    return _failed(f"its condition 'until' cannot be evaluated: {exc}")
                holds = truthy(value)
                value_json = json.dumps(value, separators=(",", ":"), default=str)
            outcome: IterationOutcome = "held" if holds else "not_held"
            self._ended(step, iteration, outcome, value_json, result)
            last = dict(result.outputs)
            if holds:
                return _done(iteration, True, last)
            iteration += 1

    async def _child(
        self, step: LoopStep | SubplanStep, iteration: int, inputs: dict[str, Any]
    ) -> ChildResult | _Outcome:
        """Run the nested plan of ``step``'s ``iteration`` (a sub-plan's attempt)."""
        state = self.state
        plan = state.plan
        kind = f"iteration {iteration}" if isinstance(step, LoopStep) else "sub-plan"
        try:
            nested = Plan(
                id=self.plan_id_of(step, iteration),
                owner=plan.owner,
                goal=f"{kind} of step {step.id!r} of plan {plan.id!r}",
                steps=step.steps,
                inputs=inputs,
                max_in_flight=step.max_in_flight,
                on_failure=step.on_failure,
                budget=self.admission.remaining(),
                parent=step_run_id(plan.id, plan.revision, step.id),
            )
        except ValidationError as exc:
            return _failed(f"its nested plan cannot be made: {exc.errors()[0]['msg']}")
        key = expansion_key(step.id, iteration)

        def started(handle: object) -> None:
            self.handles[key] = handle  # without a store: undone from memory, even if cut short

        try:
            return await self.children.run(nested, started)
        except PlanningError as exc:
            return _failed(f"its nested plan {nested.id!r} cannot run: {exc}")

    def _ended(
        self,
        step: LoopStep | SubplanStep,
        iteration: int,
        outcome: IterationOutcome,
        value_json: str,
        result: ChildResult,
    ) -> None:
        """Iteration ``iteration`` ended with ``outcome``: recorded, charged, and (a loop's) told
        in an event whose message starts ``"iteration N ended (OUTCOME)"`` (replay reads it)."""
        message = ""
        if isinstance(step, LoopStep):
            message = f"iteration {iteration} ended ({outcome})"
            if step.until is not None and outcome != "failed":
                shown = value_json if len(value_json) <= _SHOWN else value_json[:_SHOWN] + "..."
                message += f": until {step.until!r} gave {shown}"
        self.admission.charge(result.calls, result.cost)
        loop_ledger.iteration_ended(
            self.state,
            step.id,
            iteration,
            outcome,
            value_json,
            dict(result.outputs),
            (result.calls, result.cost),
            message,
        )

    def _child_failed(
        self,
        step: LoopStep | SubplanStep,
        iteration: int,
        result: ChildResult,
        charge: bool = True,
    ) -> _Outcome:
        if charge:
            self._ended(step, iteration, "failed", "null", result)
        nested = self.plan_id_of(step, iteration)
        what = "its nested plan" if isinstance(step, SubplanStep) else f"iteration {iteration}"
        if result.failures:
            first = result.failures[0]
            return _Outcome(
                None,
                first.failure_class,
                f"{what} ({nested}) {result.status.value}: step {first.step_id!r} failed "
                f"({first.failure_class.value}): {first.message}",
                1,
            )
        failure_class = (
            FailureClass.CANCELLED if result.status is PlanStatus.CANCELLED else FailureClass.LOGIC
        )
        return _Outcome(None, failure_class, f"{what} ({nested}) ended {result.status.value}", 1)

    def _exhausted(
        self, step: LoopStep, iterations: int, last: dict[str, Any] | None, bound: str
    ) -> _Outcome:
        if step.until is None or step.on_exhausted == "succeed":
            return _done(iterations, False, last)
        limit = step.max_iterations if bound == "max_iterations" else f"{step.timebox_s:g}s"
        return _failed(
            f"it reached its bound ({bound} {limit}) after {iterations} iteration(s) without "
            f"'until' ({step.until}) holding"
        )


def _done(iterations: int, done: bool, last: dict[str, Any] | None) -> _Outcome:
    return _Outcome({"iterations": iterations, "done": done, "last": last or {}}, None, "", 1)


def _failed(reason: str) -> _Outcome:
    return _Outcome(None, FailureClass.LOGIC, reason, 1)
