"""The run's scheduler: starts ready steps, settles finished ones, ends or replans the run."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import time
from typing import TypeVar, cast

from opentelemetry.trace import Status, StatusCode

from stratagem.planning._engine._attempts import _StepTries
from stratagem.planning._engine._compensation import _Compensation
from stratagem.planning._engine._observe import _traceparent
from stratagem.planning._engine._policy import Action
from stratagem.planning._engine._state import _Outcome
from stratagem.planning._engine._types import PlanResult
from stratagem.planning._errors import PlanValidationError, StepFailure, StoreError
from stratagem.planning._plan import FailureClass, GateStep, Plan, PlanStatus, Step, StepStatus
from stratagem.planning._revisions import replan_rationale
from stratagem.planning._store import PlanStatusRecord, StepIntent, StepResult

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _PlanRun(_Compensation[P]):
    """One run of one plan: the scheduler over the parts (``_state`` to ``_compensation``)."""

    async def execute(self) -> PlanResult[P]:
        """Run this revision to its end: the plan span, the scheduler, compensation, the result.

        Returns early after a replan (``replacement`` then holds the next revision's run).
        """
        plan = self.plan
        started = time.monotonic()
        logger.info(
            "plan %s@%d (%s): running %d steps", plan.id, plan.revision, self.agent, len(plan.steps)
        )
        with self.tracer.start_as_current_span(
            f"invoke_agent {self.agent}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self.agent,
                "gen_ai.agent.id": self.engine.agent_id,
                "stratagem.plan.id": plan.id,
                "stratagem.plan.revision": plan.revision,
            },
            links=self.links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            # Step and tool spans are made only under a recording plan span: a no-op tracer
            # (no provider set up) or a sampled-out plan then costs nothing per step.
            self.tracing = span.is_recording()
            self.span = span
            self._emit("", PlanStatus.RUNNING, 0)
            now = self.admission.clock()
            if self.admission.started_at is None:
                self.admission.started_at = now
            self._record(
                PlanStatusRecord(
                    plan.id,
                    plan.revision,
                    PlanStatus.RUNNING,
                    at=now,
                    # Also when this process does not trace: a run inside a caller's trace
                    # keeps that trace's id, so the history can name it.
                    trace_context=_traceparent(span) if span.get_span_context().is_valid else "",
                )
            )
            try:
                await self._schedule()
                status = self._end_status()
                if status is PlanStatus.FAILED and await self._replan():
                    span.set_attribute("stratagem.plan.status", "replanned")
                    self.metrics.plan_ended(self.agent, "replanned")
                    return self._result(status, time.monotonic() - started)
                if status is not PlanStatus.PAUSED:
                    self._close_gates()
                    self._skip_pending()
                if status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
                    await self._compensate(status)
                message = "the plan was paused" if status is PlanStatus.PAUSED else ""
                message = _summary(self.failures) or message
                if self.journal is not None:
                    self._record(PlanStatusRecord(plan.id, plan.revision, status, message))
                    await self.journal.flush()
            except (asyncio.CancelledError, StoreError) as exc:
                await self._interrupt()
                if isinstance(exc, asyncio.CancelledError):
                    reason, message = "cancelled", "the plan run was cancelled"
                else:
                    reason, message = str(exc), f"the plan run stopped: {exc}"
                span.set_attribute("stratagem.plan.status", PlanStatus.CANCELLED.value)
                span.set_status(Status(StatusCode.ERROR, reason))
                self._emit("", PlanStatus.CANCELLED, 0, message=message)
                self.metrics.plan_ended(self.agent, "interrupted")
                logger.info("plan %s@%d: interrupted (%s)", plan.id, plan.revision, reason)
                raise
            finally:
                self.watchdog.close()
            span.set_attribute("stratagem.plan.status", status.value)
            if status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
                span.set_status(Status(StatusCode.ERROR, message or status.value))
            self._emit("", status, 0, message=message)
        self.metrics.plan_ended(self.agent, status.value)
        duration = time.monotonic() - started
        logger.info("plan %s@%d: %s in %.3fs", plan.id, plan.revision, status.value, duration)
        return self._result(status, duration)

    async def _schedule(self) -> None:
        if not self.restored:
            self.ready.extend(step_id for step_id, count in self.waiting.items() if count == 0)
        # Completions are handled in task done-callbacks rather than by this coroutine waking up
        # for each one: scheduling the next steps then costs no extra event-loop round trip.
        self.callback_context = contextvars.copy_context()  # inside the plan span
        for gate_id in self.new_gates:
            self._announce_gate(gate_id)
        self.new_gates.clear()
        self._start_ready()
        self._maybe_finish()
        try:
            await self.finished
        except (asyncio.CancelledError, StoreError):
            self.interrupted = True
            self.stop_reason = "the plan run was cancelled"
            tasks = list(self.running)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
            for task in tasks:  # normally settled already by their callbacks
                self._on_done(task)
            self._skip_pending()
            raise

    def _start_ready(self) -> None:
        ready, running, statuses = self.ready, self.running, self.statuses
        journal, plan = self.journal, self.plan
        while ready and not self.stop_reason and not self.paused:
            step = self.steps[ready[0]]
            if isinstance(step, GateStep):
                ready.popleft()
                self._reach_gate(step)
                continue
            if len(running) >= self.bound:
                break
            step_id = ready.popleft()
            attempt = self.next_attempt.pop(step_id, 1) if self.next_attempt else 1
            cost: float | None = None
            admission = self.admission
            if admission.budget is not None or self.breakers.states:
                denial, exhausted, cost = admission.admit(step)
                if denial:
                    self.attempts[step_id] = attempt - 1
                    self._deny(step, attempt - 1, denial, exhausted)
                    continue
            statuses[step_id] = StepStatus.RUNNING
            self.attempts[step_id] = attempt
            self._emit(step_id, StepStatus.RUNNING, attempt)
            # The intent joins this tick's batch (with the results that unblocked the step), so
            # the step's start costs no commit of its own.
            durable = None
            if journal is not None:
                durable = journal.add(StepIntent(plan.id, plan.revision, step_id, attempt, cost))
                if not self._needs_durable_intent(step):
                    durable = self.no_wait
            task = self.loop.create_task(
                self._retry(step, _StepTries(self, step, durable), attempt, 1)
            )
            task.add_done_callback(self._on_done, context=self.callback_context)
            running[task] = step_id

    def _on_done(self, task: asyncio.Task[_Outcome]) -> None:
        """A step task finished: settle it, then start what it unblocked (a done-callback)."""
        step_id = self.running.pop(task, None)
        if step_id is None:
            return
        finished = self.finished
        try:
            if self._settle(step_id, task):
                self._release(step_id)
            elif self.statuses[step_id] is StepStatus.BLOCKED:
                pass  # held at a policy gate
            elif not task.cancelled():
                self._stop(f"the plan stopped after step {step_id!r} failed")
            self._start_ready()
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            if finished.done():
                raise
            finished.set_exception(exc)
            return
        self._maybe_finish()

    def _settle(self, step_id: str, task: asyncio.Task[_Outcome]) -> bool:
        """Record a finished step task; True when the step succeeded."""
        attempts = self.attempts[step_id]
        plan = self.plan
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or isinstance(exc, StoreError):
            self.statuses[step_id] = StepStatus.CANCELLED
            message = self.stop_reason or "cancelled"
            self._record(
                StepResult(
                    plan.id,
                    plan.revision,
                    step_id,
                    attempts,
                    StepStatus.CANCELLED,
                    failure_class=FailureClass.CANCELLED,
                    message=message,
                )
            )
            self._emit(step_id, StepStatus.CANCELLED, attempts, FailureClass.CANCELLED, message)
            return False
        if exc is None:
            outcome = task.result()
        else:  # the step runner catches every Exception; this is a bug in the engine
            logger.error("step %s raised out of the engine", step_id, exc_info=exc)
            outcome = _Outcome(None, FailureClass.LOGIC, f"{type(exc).__name__}: {exc}", attempts)
        if outcome.failure_class is None and self.journal is not None:
            try:
                output_json = json.dumps(outcome.output)
            except (TypeError, ValueError) as err:
                outcome = _Outcome(
                    None, FailureClass.LOGIC, f"the output is not JSON: {err}", attempts
                )
            else:
                self._succeed(step_id, outcome.output, attempts, output_json)
                return True
        if outcome.failure_class is None:
            self._succeed(step_id, outcome.output, attempts, None)
            return True
        if outcome.action is Action.GATE:
            self._policy_gate(self.steps[step_id], outcome.attempts, outcome.message)
            return False
        self._fail(step_id, outcome.failure_class, outcome.message, outcome.attempts)
        return False

    def _deny(self, step: Step, attempts: int, message: str, exhausted: bool) -> None:
        """Admission refused an attempt of ``step``: hold it at a policy gate, or fail it."""
        if self.policy.after_denial(step, exhausted) is Action.GATE:
            self._policy_gate(step, attempts, message)
            return
        self._fail(step.id, FailureClass.POLICY, message, attempts)
        self._stop(f"the plan stopped after step {step.id!r} failed")

    async def _replan(self) -> bool:
        """After a logic failure, ask the replanner for the next revision; True when it gave one.

        The current revision's run ends here (its gates closed, its pending steps skipped, its
        journal flushed), the revision is stored, and ``replacement`` holds the next run.
        """
        engine = self.engine
        replanner = engine.replanner
        if (
            replanner is None
            or self.cancelled
            or self.replans >= engine.config.max_replans
            or not self.policy.may_replan(self.failures)
        ):
            return False
        failure = self.failures[0]
        try:
            made = replanner.replan(self.plan, failure)
            new_plan = await made if inspect.isawaitable(made) else made
        except Exception:
            logger.exception("plan %s: the replanner failed", self.plan.id)
            return False
        if new_plan is None:
            return False
        self._close_gates()
        self._skip_pending()
        if self.journal is not None:
            await self.journal.flush()
        rationale = replan_rationale(failure)
        try:
            revision, state = await engine._revise(
                self.plan,
                new_plan,
                self.outputs,
                self.attempts,
                self.compensation,
                rationale,
                # A model's repair names the model (its provenance), else the agent's replanner.
                new_plan.provenance.author if new_plan.provenance else f"replanner:{self.agent}",
                spent=(self.admission.spent_calls, self.admission.spent_cost),
            )
        except PlanValidationError as exc:
            logger.error("plan %s: the replanner's plan is not a DAG: %s", self.plan.id, exc)
            return False
        logger.info(
            "plan %s: revision %d replaces %d (%d result(s) carried over)",
            self.plan.id,
            revision.revision,
            self.plan.revision,
            len(revision.record.carried),
        )
        run = _PlanRun(engine, cast(P, revision.plan), self.on_event)
        run.is_dag()
        run.restore(state)
        run.replans = self.replans + 1
        self.replacement = run
        return True


def _summary(failures: list[StepFailure]) -> str:
    if not failures:
        return ""
    first = failures[0]
    text = f"step {first.step_id!r} failed ({first.failure_class.value}): {first.message}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    return text
