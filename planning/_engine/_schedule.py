"""The scheduler: starts ready steps under the in-flight bound and settles finished ones.

Kahn's algorithm driven by completions: a step task's done-callback settles it (through the
run's state), which makes its dependents ready, and starts what is ready at once. A map step's
task runs its items (``_map``), a loop's or a sub-plan's its nested plans (``_nested``); each
takes one slot of the in-flight bound and is settled like any step.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from typing import Any

from stratagem.planning._artifacts._claim import Claimed
from stratagem.planning._engine._attempts import _Outcome, _StepRunner
from stratagem.planning._engine._conditions import _Conditions
from stratagem.planning._engine._gates import _Gates
from stratagem.planning._engine._map import _Maps
from stratagem.planning._engine._nested import _Nested
from stratagem.planning._engine._policy import Action, FailurePolicy, _Admission, _Breakers
from stratagem.planning._engine._state import _resume as resume
from stratagem.planning._engine._state import _RunState
from stratagem.planning._errors import StoreError
from stratagem.planning._kinds import (
    KINDS,
    attempts_tool,
    is_decided,
    is_expanded,
    runs_items,
    runs_plans,
    tool_of,
)
from stratagem.planning._plan import FailureClass, LoopStep, MapStep, Step, SubplanStep

logger = logging.getLogger(__name__)

# ``json.dumps`` with its defaults, without its own call per step: the encoder it uses then.
_to_json = json.JSONEncoder().encode


class _Scheduler:
    """Starts the ready steps and settles the finished ones, until the run has nothing to do."""

    def __init__(
        self,
        state: _RunState[Any],
        gates: _Gates,
        conditions: _Conditions,
        runner: _StepRunner,
        maps: _Maps,
        nested: _Nested,
        admission: _Admission,
        breakers: _Breakers,
        policy: FailurePolicy,
        bound: int,
    ) -> None:
        self.state = state
        self.gates = gates
        self.conditions = conditions
        self.runner = runner
        self.maps = maps
        self.nested = nested
        self.admission = admission
        self.breakers = breakers
        self.policy = policy
        self.bound = bound
        # The steps expanded rather than attempted (maps, loops, sub-plans) and those decided
        # (gates), found once from the table's rows (no call per step of the plan): a plan
        # without any pays one truthiness test per step started.
        expanded = {name for name, row in KINDS.items() if row.expanded}
        decided = {name for name, row in KINDS.items() if row.start == "decide"}
        steps = state.plan.steps
        self.expanded = frozenset(step.id for step in steps if step.kind in expanded)
        self.decided = frozenset(step.id for step in steps if step.kind in decided)
        # The context the done-callbacks run in (set inside the plan span when the run starts).
        self.callback_context = contextvars.copy_context()

    async def run(self, fresh: bool) -> None:
        """Schedule until the run has nothing more to do (``fresh``: not a resumed run)."""
        state = self.state
        if fresh:
            resume.load_ready(state)
        # Completions are handled in task done-callbacks rather than by this coroutine waking up
        # for each one: scheduling the next steps then costs no extra event-loop round trip.
        self.callback_context = contextvars.copy_context()  # inside the plan span
        self.gates.announce_found()
        self.start_ready()
        state.maybe_finish()
        try:
            await state.finished
        except (asyncio.CancelledError, StoreError):
            tasks = list(state.running)
            state.interrupt("the plan run was cancelled")
            if tasks:
                await asyncio.wait(tasks)
            for task in tasks:  # normally settled already by their callbacks
                self._on_done(task)
            state.skip_pending()
            raise

    def wake(self) -> None:
        """Something outside a step (a decision) made steps ready: start them."""
        state = self.state
        try:
            # The decision comes from the caller's task; the steps it releases belong under the
            # plan span, like those a completion starts.
            self.callback_context.run(self.start_ready)
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            state.crash(exc)
            return
        state.maybe_finish()

    def start_ready(self) -> None:
        """Start the ready steps, as many as the bound allows."""
        state = self.state
        ready, running, steps, runner = state.ready, state.running, state.steps, self.runner
        loop = state.loop
        undecided, conditions = state.undecided, self.conditions
        expanded, decided = self.expanded, self.decided
        while ready and not state.stop_reason and not state.paused:
            step = steps[ready[0]]
            if undecided and step.id in undecided and not conditions.decide(step):
                state.take_ready()  # skipped (or its condition failed): never starts
                continue
            if decided and step.id in decided:
                assert is_decided(step)
                state.take_ready()
                self.gates.reach(step)
                continue
            if self.gates.approvals and attempts_tool(step) and self.gates.ask_approval(step):
                state.take_ready()  # waits at its tool gate
                continue
            if len(running) >= self.bound:
                break
            if expanded and step.id in expanded:
                assert is_expanded(step)
                self._start_expanding(step)
                continue
            cost: float | None = None
            admission, notices = self.admission, self.gates.approved_notices
            if admission.budget is not None or self.breakers.states:
                step_id, attempt = state.take_next()
                denial, exhausted, cost = admission.admit(step)
                if denial:
                    state.denied(step_id, attempt - 1)
                    self._deny(step, attempt - 1, denial, exhausted)
                    continue
                # (the notice: the step's tool gate was just approved)
                state.start(step_id, attempt, notices.pop(step_id, None) if notices else None)
            else:  # nothing to admit: taken and started in one transition
                step_id, attempt = state.start_next(notices.pop(step.id, None) if notices else None)
            # The intent joins this tick's batch (with the results that unblocked the step), so
            # the step's start costs no commit of its own.
            task = loop.create_task(runner.run(step, attempt, cost))
            task.add_done_callback(self._on_done, context=self.callback_context)
            state.launched(task, step_id)

    def _start_expanding(self, step: MapStep | LoopStep | SubplanStep) -> None:
        """Start a step that is expanded rather than attempted: a map's items, a loop's or a
        sub-plan's nested plans. Its own start is not an attempt: it reserves nothing (its items
        and the nested plans' steps do) and journals no intent (its parts journal what it does)."""
        state = self.state
        step_id = state.take_ready()
        attempt = state.take_next_attempt(step_id)
        if runs_items(step) and any(rule.tool == tool_of(step) for rule in self.gates.approvals):
            # The policy asks an approval per call of this tool: no map runs it unasked (fail
            # closed), and none asks once for all its items.
            state.fail(
                step_id,
                FailureClass.POLICY,
                f"tool {step.tool!r} needs an approval per call (the policy's tool approvals); "
                f"a map does not run it: call it from tool steps",
                0,
                stop=f"the plan stopped after step {step_id!r} failed",
            )
            return
        state.start(step_id, attempt)
        if runs_items(step):
            work = self.maps.run(step, attempt)
        else:
            assert runs_plans(step)
            work = self.nested.run(step, attempt)
        task = state.loop.create_task(work)
        task.add_done_callback(self._on_done, context=self.callback_context)
        state.launched(task, step_id)

    def _on_done(self, task: asyncio.Task[_Outcome]) -> None:
        """A step task finished: settle it, then start what it unblocked (a done-callback)."""
        state = self.state
        step_id = state.landed(task)
        if step_id is None:
            return
        try:
            self._settle(step_id, task)
            self.start_ready()
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            if state.finished.done():
                raise
            state.crash(exc)
            return
        state.maybe_finish()

    def _settle(self, step_id: str, task: asyncio.Task[_Outcome]) -> bool:
        """Record a finished step task; True when the step succeeded (a failure stops the plan,
        unless it is routed or independent steps go on: ``_RunState.fail``)."""
        state = self.state
        attempts = state.attempts[step_id]
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or isinstance(exc, StoreError):
            state.cancel_step(step_id, attempts)
            return False
        if exc is None:
            outcome = task.result()
        else:  # the step runner catches every Exception; this is a bug in the engine
            logger.error("step %s raised out of the engine", step_id, exc_info=exc)
            outcome = _Outcome(None, FailureClass.LOGIC, f"{type(exc).__name__}: {exc}", attempts)
        if outcome.failure_class is None and state.journal is not None:
            try:
                output_json = (
                    outcome.output.journal_json  # a claim check: the journal keeps the reference
                    if isinstance(outcome.output, Claimed)
                    else _to_json(outcome.output)
                )
            except (TypeError, ValueError) as err:
                outcome = _Outcome(
                    None, FailureClass.LOGIC, f"the output is not JSON: {err}", attempts
                )
            else:
                state.succeed(step_id, outcome.output, attempts, output_json)
                return True
        if outcome.failure_class is None:
            state.succeed(step_id, outcome.output, attempts, None)
            return True
        if outcome.action is Action.GATE:
            self.gates.hold(state.steps[step_id], outcome.attempts, outcome.message)
            return False
        state.fail(
            step_id,
            outcome.failure_class,
            outcome.message,
            outcome.attempts,
            stop=f"the plan stopped after step {step_id!r} failed",
        )
        return False

    def _deny(self, step: Step, attempts: int, message: str, exhausted: bool) -> None:
        """Admission refused an attempt of ``step``: hold it at a policy gate, or fail it."""
        if self.policy.after_denial(step, exhausted) is Action.GATE:
            self.gates.hold(step, attempts, message)
            return
        self.state.fail(
            step.id,
            FailureClass.POLICY,
            message,
            attempts,
            stop=f"the plan stopped after step {step.id!r} failed",
        )
