"""The run's state, ``_RunState``, and its transitions for the run as a whole, its steps, its
gates and its compensation (the package's docstring says who else changes it)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from typing import Any, Generic, TypeVar

from stratagem.planning._engine._journal import _Journal
from stratagem.planning._engine._observe import _Observer
from stratagem.planning._engine._state._ledgers import _Items, _Iterations, _Ready
from stratagem.planning._engine._types import GateNotice, PlanResult
from stratagem.planning._errors import StepFailure
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, Step, StepStatus
from stratagem.planning._store import (
    CompensationRecord,
    CompensationStatus,
    ConditionRecord,
    GateKind,
    GateRecord,
    PlanStatusRecord,
    Record,
    StateStore,
    StepResult,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _RunState(Generic[P]):
    """The state of one run of one plan (one revision).

    Everything runs on the event loop's thread: the step tasks, the done-callbacks that settle
    them and the control calls change this state only between awaits, so it needs no locks.

    Attributes:
        plan: The plan (revision) being run.
        steps: Step id -> step.
        outputs: Step id -> output, for the steps that succeeded.
        statuses: Step id -> status, in plan order.
        attempts: Step id -> its latest attempt.
        failures: The steps that failed, in order.
        stop_reason: Why the run stopped ("" while it goes on): nothing new starts then.
        cancelled: ``Engine.cancel`` cancelled the plan (it compensates and ends ``cancelled``).
        paused: ``Engine.pause``: nothing new starts; the run ends ``paused``.
        interrupted: The run's task was cancelled, or the store failed: nothing more is recorded.
        blocked: The plan is ``blocked`` at an open gate.
        gates: The open gates: gate (or held step) id -> kind.
        ready: Steps that may start, in order.
        next_attempt: Steps resumed mid-way (or re-run after a decision): the attempt they start at.
        running: The step tasks in flight -> their step id.
        compensable: Succeeded steps with a compensation, in completion order.
        compensation: Step id -> where its compensation is.
        compensation_attempts: Step id -> its compensation's latest attempt.
        continue_independent: The plan's ``on_failure`` lets independent steps go on.
        routed: The steps whose failure is handled by a step that runs on failure.
        handled: The failures of routed steps, in order (not the plan's failures).
        undecided: Steps to decide before they start: a condition, a route on failure, or a
            dependency that did not succeed (``_conditions._Conditions`` decides).
        blocked_by: A pending step -> the first of its dependencies that did not succeed.
        expansions: Map step id -> its items (``_Items``), once its list is evaluated.
        iterations: Loop (or sub-plan) step id -> its iterations (``_Iterations``).
        finished: Done when the run has nothing more to do (or carries what broke it).
        journal: The run's journal (``None`` without a store).
    """

    def __init__(self, plan: P, observer: _Observer, store: StateStore | None) -> None:
        self.plan = plan
        self.observer = observer
        self.steps: dict[str, Step] = {step.id: step for step in plan.steps}
        self.outputs: dict[str, Any] = {}
        self.statuses: dict[str, StepStatus] = {step.id: StepStatus.PENDING for step in plan.steps}
        self.attempts: dict[str, int] = {}
        self.failures: list[StepFailure] = []
        self.stop_reason = ""
        self.cancelled = False
        self.paused = False
        self.interrupted = False
        self.blocked = False
        self.gates: dict[str, GateKind] = {}
        self.waiting: dict[str, int] = {}
        self.dependents: dict[str, list[str]] = {step.id: [] for step in plan.steps}
        self.ready: deque[str] | _Ready = deque()
        self.next_attempt: dict[str, int] = {}
        self.running: dict[asyncio.Task[Any], str] = {}
        self.compensable: list[str] = []
        self.compensation: dict[str, CompensationStatus] = {}
        self.compensation_attempts: dict[str, int] = {}
        self.continue_independent = plan.on_failure == "continue_independent"
        self.routed: set[str] = set()  # steps whose failure a "failure" route handles
        self.handled: list[StepFailure] = []  # their failures (not the plan's)
        self.undecided: set[str] = set()  # steps to decide (``_conditions``) before they start
        self.blocked_by: dict[str, str] = {}  # a pending step -> a dependency that did not succeed
        self.expansions: dict[str, _Items] = {}
        self.iterations: dict[str, _Iterations] = {}
        self.loop = asyncio.get_running_loop()  # a run is made inside Engine.run
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.journal = None if store is None else _Journal(store, self.loop, self._store_failed)

    # --- reading ---------------------------------------------------------------------------

    def is_dag(self) -> bool:
        """Whether the steps form a DAG (unique ids, known dependencies, no cycle); fills the
        dependency counts the ready queue is driven by.

        A linear pass, so the common case costs little; ``structural_problems`` explains a no.
        """
        plan, waiting, dependents = self.plan, self.waiting, self.dependents
        if len(self.steps) != len(plan.steps):
            return False
        prioritized = False
        for step in plan.steps:
            if step.priority:
                prioritized = True
            deps = step.depends_on
            if len(deps) > 1:
                deps = list(dict.fromkeys(deps))  # a repeated dependency counts once
            waiting[step.id] = len(deps)
            if step.when is not None or step.runs_on != "success":
                self.undecided.add(step.id)
                if step.runs_on == "failure":
                    self.routed.update(deps)
            for dep in deps:
                if dep not in dependents:
                    return False
                dependents[dep].append(step.id)
        if prioritized and not self.ready:
            self.ready = _Ready(plan)
        left = dict(waiting)
        queue = [step_id for step_id, count in left.items() if count == 0]
        reached = 0
        while queue:
            step_id = queue.pop()
            reached += 1
            for dependent in dependents[step_id]:
                left[dependent] -= 1
                if left[dependent] == 0:
                    queue.append(dependent)
        return reached == len(plan.steps)

    def end_status(self) -> PlanStatus:
        """How the run ends, as things stand."""
        if self.cancelled:
            return PlanStatus.CANCELLED
        if self.failures:
            return PlanStatus.FAILED
        if self.paused and any(
            s in (StepStatus.PENDING, StepStatus.BLOCKED) for s in self.statuses.values()
        ):
            return PlanStatus.PAUSED
        return PlanStatus.SUCCEEDED

    def result(self, status: PlanStatus, duration: float) -> PlanResult[P]:
        """The run's result."""
        return PlanResult(
            status=status,
            outputs=self.outputs,
            failures=self.failures,
            statuses=self.statuses,
            events=self.observer.events,
            duration_s=duration,
            submitted=self.plan,
            handled=self.handled,
        )

    def record(self, *records: Record) -> None:
        """Queue ``records`` for the journal (unless the run has no store or was interrupted)."""
        if self.journal is not None and not self.interrupted:
            self.journal.add(*records)

    # --- the run as a whole ------------------------------------------------------------------

    def plan_running(self, at: float, trace_context: str) -> None:
        """The run starts (or continues after a resume)."""
        plan = self.plan
        self.observer.emit("", PlanStatus.RUNNING, 0)
        self.record(
            PlanStatusRecord(
                plan.id, plan.revision, PlanStatus.RUNNING, at=at, trace_context=trace_context
            )
        )

    def plan_ended(self, status: PlanStatus, message: str) -> None:
        """The run ends with ``status`` (recorded only with a store; the event is the last)."""
        if self.journal is not None:
            plan = self.plan
            self.record(PlanStatusRecord(plan.id, plan.revision, status, message))

    def plan_event(self, status: PlanStatus, message: str = "") -> None:
        """The plan's event for ``status`` (recorded elsewhere, or a recorded result read back)."""
        self.observer.emit("", status, 0, message=message)

    def stop(self, reason: str) -> None:
        """Start nothing new and cancel the running steps (the first reason given is kept)."""
        if self.stop_reason:
            return
        self.stop_reason = reason
        for task in self.running:
            task.cancel()

    def interrupt(self, reason: str) -> None:
        """The run's task was cancelled (or the store failed): record nothing more, cancel the
        running steps."""
        self.interrupted = True
        self.stop_reason = reason
        for task in self.running:
            task.cancel()

    def pause(self) -> None:
        """Start no new step; the run ends ``paused`` once the running steps finish."""
        if self.paused or self.stop_reason:
            return
        self.paused = True
        logger.info("plan %s@%d: pausing", self.plan.id, self.plan.revision)
        self.maybe_finish()

    def cancel(self) -> None:
        """Cancel the running steps; the run compensates and ends ``cancelled``."""
        if self.cancelled:
            return
        self.cancelled = True
        self.paused = False
        logger.info("plan %s@%d: cancelling", self.plan.id, self.plan.revision)
        self.stop_reason = ""
        self.stop("the plan was cancelled")
        self.maybe_finish()

    def maybe_finish(self) -> None:
        """End the run if nothing runs and nothing waits for a decision that could come."""
        if self.running or self.finished.done():
            return
        if self.gates and not (self.stop_reason or self.paused):
            return
        self.finished.set_result(None)

    def crash(self, exc: BaseException) -> None:
        """A bug in the engine: hand it to whoever awaits the run, rather than hang it."""
        if not self.finished.done():
            self.finished.set_exception(exc)

    def _store_failed(self, exc: BaseException) -> None:
        self.interrupted = True
        if not self.finished.done():
            self.finished.set_exception(exc)

    async def abort_journal(self) -> None:
        """Drop what is not committed (an interruption); nothing more is recorded."""
        self.interrupted = True
        if self.journal is not None:
            await self.journal.abort()

    # --- steps -------------------------------------------------------------------------------

    def start(self, step_id: str, attempt: int, gate: GateNotice | None = None) -> None:
        """Attempt ``attempt`` of ``step_id`` starts (``gate``: the approval that let it)."""
        self.statuses[step_id] = StepStatus.RUNNING
        self.attempts[step_id] = attempt
        self.observer.emit(step_id, StepStatus.RUNNING, attempt, gate=gate)

    def denied(self, step_id: str, attempts: int) -> None:
        """Admission refused the attempt after ``attempts``: the step did not start."""
        self.attempts[step_id] = attempts

    def launched(self, task: asyncio.Task[Any], step_id: str) -> None:
        """``task`` runs ``step_id``'s attempts."""
        self.running[task] = step_id

    def landed(self, task: asyncio.Task[Any]) -> str | None:
        """``task`` ended: the step it ran, or ``None`` when it was settled already."""
        return self.running.pop(task, None)

    def retrying(
        self,
        step_id: str,
        attempt: int,
        failure_class: FailureClass,
        message: str,
        delay: float,
    ) -> None:
        """Attempt ``attempt`` failed; the step is retried after ``delay`` seconds."""
        plan = self.plan
        self.statuses[step_id] = StepStatus.RETRYING
        self.record(
            StepResult(
                plan.id,
                plan.revision,
                step_id,
                attempt,
                StepStatus.RETRYING,
                failure_class=failure_class,
                message=message,
            )
        )
        self.observer.emit(
            step_id,
            StepStatus.RETRYING,
            attempt,
            failure_class,
            f"{message}; retrying in {delay:.3f}s",
            delay,
        )

    def succeed(
        self,
        step_id: str,
        output: Any,
        attempt: int,
        output_json: str | None,
        gate: GateNotice | None = None,
    ) -> None:
        """``step_id`` succeeded with ``output``: its dependents may become ready (``gate``: the
        decision that made it succeed, carried by its event)."""
        self.outputs[step_id] = output
        self.statuses[step_id] = StepStatus.SUCCEEDED
        step = self.steps[step_id]
        # A map's compensation undoes its items (each registered when it succeeded), not the map.
        compensated = step.compensate is not None and step.kind != "map"
        if self.journal is not None and not self.interrupted:
            plan = self.plan
            result = StepResult(
                plan.id, plan.revision, step_id, attempt, StepStatus.SUCCEEDED, output_json
            )
            if not compensated:
                self.journal.add(result)
            else:  # the need to compensate is committed with the success, in one transaction
                self.journal.add(
                    result,
                    CompensationRecord(plan.id, plan.revision, step_id, CompensationStatus.NEEDED),
                )
        if compensated:
            self.compensable.append(step_id)
            self.compensation[step_id] = CompensationStatus.NEEDED
        self.observer.emit(step_id, StepStatus.SUCCEEDED, attempt, gate=gate)
        waiting = self.waiting
        for dependent in self.dependents[step_id]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.ready.append(dependent)

    def stops_on(self, step_id: str) -> bool:
        """Whether a failure of ``step_id`` stops the plan (fail-fast, and no route handles it)."""
        return not self.continue_independent and step_id not in self.routed

    def fail(
        self,
        step_id: str,
        failure_class: FailureClass,
        message: str,
        attempts: int,
        stop: str = "",
        gate: GateNotice | None = None,
    ) -> None:
        """``step_id`` failed for good (``gate``: the decision that failed it).

        A failure that a route on failure handles is not the plan's: the route decides. Under
        ``continue_independent`` the plan goes on with what does not depend on the step. Else
        the plan stops with reason ``stop`` (when given).
        """
        plan = self.plan
        failure = StepFailure(step_id, failure_class, message, attempts)
        routed = step_id in self.routed
        (self.handled if routed else self.failures).append(failure)
        self.statuses[step_id] = StepStatus.FAILED
        self.record(
            StepResult(
                plan.id,
                plan.revision,
                step_id,
                attempts,
                StepStatus.FAILED,
                failure_class=failure_class,
                message=message,
            )
        )
        logger.warning(
            "plan %s step %s failed (%s) after %d attempt(s): %s",
            plan.id,
            step_id,
            failure_class.value,
            attempts,
            message,
        )
        self.observer.emit(step_id, StepStatus.FAILED, attempts, failure_class, message, gate=gate)
        if routed or self.continue_independent:
            self._release_unsucceeded(step_id)
        elif stop:
            self.stop(stop)

    def skip(self, step_id: str, reason: str) -> None:
        """``step_id`` does not run (its condition is false, no dependency it routes failed, or
        a dependency did not succeed): ``skipped``, and so, in turn, what needs it."""
        plan = self.plan
        self.statuses[step_id] = StepStatus.SKIPPED
        self.undecided.discard(step_id)
        self.record(
            StepResult(plan.id, plan.revision, step_id, 0, StepStatus.SKIPPED, message=reason)
        )
        self.observer.emit(step_id, StepStatus.SKIPPED, 0, message=reason)
        self._release_unsucceeded(step_id)

    def condition(self, step_id: str, holds: bool, value_json: str) -> None:
        """``step_id``'s condition was evaluated: journaled before the step starts or is skipped."""
        plan = self.plan
        self.record(ConditionRecord(plan.id, plan.revision, step_id, holds, value_json))

    def decided(self, step_id: str) -> None:
        """``step_id`` may start: its condition holds (or it has none) and its route applies."""
        self.undecided.discard(step_id)

    def _release_unsucceeded(self, step_id: str) -> None:
        """``step_id`` settled without succeeding: its dependents are decided when they arrive."""
        waiting = self.waiting
        for dependent in self.dependents[step_id]:
            self.blocked_by.setdefault(dependent, step_id)
            self.undecided.add(dependent)
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.ready.append(dependent)

    def cancel_step(self, step_id: str, attempts: int) -> None:
        """``step_id``'s task was cancelled: the step ends ``cancelled``."""
        plan = self.plan
        self.statuses[step_id] = StepStatus.CANCELLED
        message = self.stop_reason or "cancelled"
        self.record(
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
        self.observer.emit(step_id, StepStatus.CANCELLED, attempts, FailureClass.CANCELLED, message)

    def skip_pending(self) -> None:
        """The run ends: the steps that never started are ``skipped``, each saying why."""
        statuses = self.statuses
        for step in self.plan.steps:
            if statuses[step.id] is not StepStatus.PENDING:
                continue
            blocked = next(
                (dep for dep in step.depends_on if statuses[dep] is not StepStatus.SUCCEEDED), None
            )
            if blocked is None:
                message = self.stop_reason
            else:
                message = f"dependency {blocked!r} {statuses[blocked].value}"
            statuses[step.id] = StepStatus.SKIPPED
            self.observer.emit(step.id, StepStatus.SKIPPED, 0, message=message)

    def take_ready(self) -> str:
        """The next ready step, taken off the queue."""
        return self.ready.popleft()

    def take_next_attempt(self, step_id: str) -> int:
        """The attempt ``step_id`` starts at (1, unless it resumes mid-way)."""
        return self.next_attempt.pop(step_id, 1) if self.next_attempt else 1

    def take_next(self) -> tuple[str, int]:
        """The next ready step, taken off the queue, and the attempt it starts at (one
        transition rather than two per step started)."""
        step_id = self.ready.popleft()
        return step_id, self.next_attempt.pop(step_id, 1) if self.next_attempt else 1

    def start_next(self, gate: GateNotice | None = None) -> tuple[str, int]:
        """The next ready step starts (``take_next`` and ``start`` in one transition, for a step
        that admission need not be asked about): its id and the attempt it starts at."""
        step_id = self.ready.popleft()
        attempt = self.next_attempt.pop(step_id, 1) if self.next_attempt else 1
        self.statuses[step_id] = StepStatus.RUNNING
        self.attempts[step_id] = attempt
        self.observer.emit(step_id, StepStatus.RUNNING, attempt, gate=gate)
        return step_id, attempt

    def requeue(self, step_id: str, attempt: int) -> None:
        """Run ``step_id`` again (a reconcile or policy gate approved a re-run), first in line."""
        self.statuses[step_id] = StepStatus.PENDING
        self.next_attempt[step_id] = attempt
        self.ready.appendleft(step_id)

    # --- gates -------------------------------------------------------------------------------

    def hold(self, step_id: str, attempts: int, message: str) -> None:
        """``step_id`` failed a policy check and is to be held at a policy gate."""
        plan = self.plan
        self.attempts[step_id] = attempts
        self.record(
            StepResult(
                plan.id,
                plan.revision,
                step_id,
                attempts,
                StepStatus.BLOCKED,
                failure_class=FailureClass.POLICY,
                message=message,
            )
        )

    def open_gate(self, gate_id: str, kind: GateKind) -> None:
        """A gate is open (not announced yet: a resumed run announces it when it starts)."""
        self.gates[gate_id] = kind
        self.statuses[gate_id] = StepStatus.BLOCKED

    def block(
        self,
        gate_id: str,
        kind: GateKind,
        prompt: str,
        record: GateRecord | None,
        notice: GateNotice | None = None,
    ) -> asyncio.Future[None] | None:
        """Gate ``gate_id`` is open and waits for a decision: the step and the plan are
        ``blocked``. ``record`` is its opening (``None``: recorded already); returns the commit
        of the opening to await (``None``: nothing to wait for)."""
        plan = self.plan
        self.open_gate(gate_id, kind)
        committed = None
        if record is not None and self.journal is not None and not self.interrupted:
            committed = self.journal.add(record)
        self.observer.emit(
            gate_id,
            StepStatus.BLOCKED,
            self.attempts.get(gate_id, 0),
            message=prompt,
            gate_kind=kind,
            gate=notice,
        )
        logger.info("plan %s@%d: gate %s is waiting: %s", plan.id, plan.revision, gate_id, prompt)
        if not self.blocked:
            self.blocked = True
            self.record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.BLOCKED, prompt))
            self.observer.emit("", PlanStatus.BLOCKED, 0, message=prompt)
        return committed

    def escalate_gate(
        self, gate_id: str, record: GateRecord, notice: GateNotice, message: str
    ) -> asyncio.Future[None] | None:
        """Open gate ``gate_id`` passes to others (``record``: its new opening); the step's
        ``blocked`` event says so. Returns the commit to await (``None``: no store)."""
        committed = None
        if self.journal is not None and not self.interrupted:
            committed = self.journal.add(record)
        self.observer.emit(
            gate_id,
            StepStatus.BLOCKED,
            self.attempts.get(gate_id, 0),
            message=message,
            gate_kind=record.kind,
            gate=notice,
        )
        logger.info("plan %s@%d: gate %s: %s", self.plan.id, self.plan.revision, gate_id, message)
        return committed

    async def write(self, record: Record) -> None:
        """Commit ``record`` now, after everything the run queued before it (a decision).

        Through the journal, so a decision given while the batch that opened the gate is still
        being committed lands after that batch (committed beside it, the fold would read the
        gate's opening after its decision, and lose the decision). A run being torn down commits
        no more batches: the record goes to the store directly. Without a store: nothing.
        """
        journal = self.journal
        if journal is None:
            return
        if journal.closed:
            await journal.store.commit([record])
        else:
            await journal.write(record)

    def revising(self, step_id: str) -> None:
        """An approver edited ``step_id``'s arguments: it waits for the plan's next revision,
        which runs it; this run starts nothing more and ends once its running steps finish."""
        self.statuses[step_id] = StepStatus.PENDING
        self.paused = True
        logger.info(
            "plan %s@%d: step %s continues in a new revision (its arguments were edited)",
            self.plan.id,
            self.plan.revision,
            step_id,
        )
        self.maybe_finish()

    def close_gate(self, gate_id: str) -> GateKind | None:
        """A decision reached open gate ``gate_id``: its kind (``None``: it was not open)."""
        return self.gates.pop(gate_id, None)

    def unblock(self) -> None:
        """After a decision: the plan runs again once no gate is open."""
        if not self.gates and self.blocked:
            self.blocked = False
            if not self.stop_reason:
                plan = self.plan
                self.record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.RUNNING))
                self.observer.emit("", PlanStatus.RUNNING, 0)

    def close_gates(self) -> None:
        """The plan stops with gates open: they end ``cancelled``."""
        for gate_id in list(self.gates):
            del self.gates[gate_id]
            self.statuses[gate_id] = StepStatus.CANCELLED
            message = self.stop_reason or "the plan ended"
            plan = self.plan
            self.record(
                StepResult(
                    plan.id,
                    plan.revision,
                    gate_id,
                    self.attempts.get(gate_id, 0),
                    StepStatus.CANCELLED,
                    failure_class=FailureClass.CANCELLED,
                    message=message,
                )
            )
            self.observer.emit(gate_id, StepStatus.CANCELLED, 0, FailureClass.CANCELLED, message)

    # --- compensation ------------------------------------------------------------------------

    def compensating_plan(self, message: str) -> None:
        """The plan starts compensating its succeeded steps."""
        plan = self.plan
        self.record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.COMPENSATING, message))
        self.observer.emit("", PlanStatus.COMPENSATING, 0, message=message)

    def compensating(self, step_id: str, attempt: int) -> Awaitable[None] | None:
        """Attempt ``attempt`` of ``step_id``'s compensation starts; returns the commit of its
        ``running`` record to await before the tool is called (``None`` without a store)."""
        self.compensation_attempts[step_id] = attempt
        if step_id in self.statuses:  # not a map's item or an iteration
            self.statuses[step_id] = StepStatus.COMPENSATING
        self.observer.emit(step_id, StepStatus.COMPENSATING, attempt)
        if self.journal is None:
            return None
        plan = self.plan
        return self.journal.write(
            CompensationRecord(plan.id, plan.revision, step_id, CompensationStatus.RUNNING, attempt)
        )

    def compensation_retrying(
        self,
        step_id: str,
        attempt: int,
        failure_class: FailureClass,
        message: str,
        delay: float,
    ) -> None:
        """A compensation attempt failed and is retried after ``delay`` seconds."""
        self.observer.emit(
            step_id,
            StepStatus.COMPENSATING,
            attempt,
            failure_class,
            f"{message}; retrying in {delay:.3f}s",
            delay,
        )

    def compensated(self, step_id: str, attempt: int) -> None:
        """``step_id``'s compensation succeeded."""
        plan = self.plan
        self.compensation[step_id] = CompensationStatus.COMPENSATED
        if step_id in self.statuses:
            self.statuses[step_id] = StepStatus.COMPENSATED
        self.record(
            CompensationRecord(
                plan.id, plan.revision, step_id, CompensationStatus.COMPENSATED, attempt
            )
        )
        self.observer.emit(step_id, StepStatus.COMPENSATED, attempt)

    def compensation_failed(
        self, step_id: str, attempt: int, failure_class: FailureClass, message: str
    ) -> None:
        """``step_id``'s compensation failed for good."""
        plan = self.plan
        self.compensation[step_id] = CompensationStatus.FAILED
        if step_id in self.statuses:
            self.statuses[step_id] = StepStatus.COMPENSATION_FAILED
        self.record(
            CompensationRecord(
                plan.id, plan.revision, step_id, CompensationStatus.FAILED, attempt, message
            )
        )
        self.observer.emit(step_id, StepStatus.COMPENSATION_FAILED, attempt, failure_class, message)
