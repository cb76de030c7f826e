"""The state of one run of one plan, and the transitions every part of the run shares."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, assert_never

from opentelemetry import trace
from opentelemetry.trace import Link, Span

from stratagem.planning._engine._journal import _Journal
from stratagem.planning._engine._observe import _Observer
from stratagem.planning._engine._policy import Action, _Admission
from stratagem.planning._engine._types import PlanResult, StepEvent
from stratagem.planning._engine._watchdog import _Watchdog
from stratagem.planning._errors import StepFailure
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
from stratagem.planning._store import (
    CompensationRecord,
    CompensationStatus,
    GateKind,
    GateState,
    Record,
    StepResult,
)

if TYPE_CHECKING:
    from stratagem.planning._engine._engine import Engine
    from stratagem.planning._engine._run import _PlanRun


logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


@dataclass(slots=True)
class _Outcome:
    output: dict[str, Any] | None
    failure_class: FailureClass | None
    message: str
    attempts: int
    action: Action = Action.FAIL  # for a failure: what the failure policy decided


class _RunState(_Observer[P]):
    """The state of one run of one plan.

    Everything runs on the event loop's thread: the step tasks, the done-callbacks that settle
    them and the control calls update this state only between awaits, so it needs no locks.
    """

    def __init__(
        self, engine: Engine, plan: P, on_event: Callable[[StepEvent], None] | None
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.on_event = on_event
        self.tracer = engine._tracer
        self.metrics = engine._metrics
        self.links: list[Link] = []  # a resumed run's links to the runs it continues
        self.tools = engine._tools
        self.dispatcher = engine._dispatcher
        self.sleep = engine._sleep
        self.seed = engine.config.seed
        self.agent = engine.agent
        self.default_timeout = engine.config.default_timeout_s
        self.outputs: dict[str, Any] = {}
        self.statuses: dict[str, StepStatus] = {step.id: StepStatus.PENDING for step in plan.steps}
        self.attempts: dict[str, int] = {}
        self.failures: list[StepFailure] = []
        self.events = 0
        self.stop_reason = ""
        self.tracing = False
        self.span: Span = trace.INVALID_SPAN  # the plan span, for events (when ``tracing``)
        self.steps: dict[str, Step] = {step.id: step for step in plan.steps}
        self.waiting: dict[str, int] = {}
        self.dependents: dict[str, list[str]] = {step.id: [] for step in plan.steps}
        self.ready: deque[str] = deque()
        self.running: dict[asyncio.Task[_Outcome], str] = {}
        self.bound = plan.max_in_flight or engine.config.max_in_flight
        self.loop = asyncio.get_running_loop()  # a run is made inside Engine.run
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.callback_context = contextvars.copy_context()
        self.watchdog = _Watchdog(self.loop)
        store = engine.store
        self.journal = None if store is None else _Journal(store, self.loop, self._store_failed)
        self.restored = False
        self.interrupted = False  # the run's task was cancelled, or the store failed
        self.cancelled = False  # Engine.cancel
        self.paused = False
        self.blocked = False
        self.gates: dict[str, GateKind] = {}  # the open gates
        self.new_gates: list[str] = []  # reconcile gates found by restore, not yet announced
        self.recorded_gates: set[str] = set()  # gates whose opening is in the journal
        self.decisions: dict[str, GateState] = {}  # decided before their gate step was reached
        self.next_attempt: dict[str, int] = {}  # steps resumed mid-way
        self.compensable: list[str] = []  # succeeded steps with a compensation, in order
        self.compensation: dict[str, CompensationStatus] = {}
        self.compensation_attempts: dict[str, int] = {}
        self.gate_prompts: dict[str, str] = {}  # policy gates: the prompt naming the failure
        self.replans = 0
        self.replacement: _PlanRun[P] | None = None  # the next revision's run, after a replan
        self.policy = engine._policy
        self.breakers = engine._breakers
        self.admission = _Admission(plan.budget, engine._breakers, self.tools, engine.clock)
        # Steps that need not wait for their intent's commit (see _needs_durable_intent), and a
        # completed future that stands for "no wait".
        self.no_wait: asyncio.Future[None] = self.loop.create_future()
        self.no_wait.set_result(None)
        self.intent_waits: dict[str, bool] = {}

    def _result(self, status: PlanStatus, duration: float) -> PlanResult[P]:
        return PlanResult(
            status=status,
            outputs=self.outputs,
            failures=self.failures,
            statuses=self.statuses,
            events=self.events,
            duration_s=duration,
            submitted=self.plan,
        )

    def _end_status(self) -> PlanStatus:
        if self.cancelled:
            return PlanStatus.CANCELLED
        if self.failures:
            return PlanStatus.FAILED
        if self.paused and any(
            s in (StepStatus.PENDING, StepStatus.BLOCKED) for s in self.statuses.values()
        ):
            return PlanStatus.PAUSED
        return PlanStatus.SUCCEEDED

    def is_dag(self) -> bool:
        """Whether the steps form a DAG (unique ids, known dependencies, no cycle).

        A linear pass, so the common case costs little; ``structural_problems`` explains a no.
        """
        plan, waiting, dependents = self.plan, self.waiting, self.dependents
        if len(self.steps) != len(plan.steps):
            return False
        for step in plan.steps:
            deps = step.depends_on
            if len(deps) > 1:
                deps = list(dict.fromkeys(deps))  # a repeated dependency counts once
            waiting[step.id] = len(deps)
            for dep in deps:
                if dep not in dependents:
                    return False
                dependents[dep].append(step.id)
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

    def _release(self, step_id: str) -> None:
        waiting = self.waiting
        for dependent in self.dependents[step_id]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.ready.append(dependent)

    def _stop(self, reason: str) -> None:
        if self.stop_reason:
            return
        self.stop_reason = reason
        for task in self.running:
            task.cancel()

    def _maybe_finish(self) -> None:
        if self.running or self.finished.done():
            return
        if self.gates and not (self.stop_reason or self.paused):
            return
        self.finished.set_result(None)

    def _store_failed(self, exc: BaseException) -> None:
        self.interrupted = True
        if not self.finished.done():
            self.finished.set_exception(exc)

    async def _interrupt(self) -> None:
        self.interrupted = True
        if self.journal is not None:
            await self.journal.abort()

    def _record(self, *records: Record) -> None:
        if self.journal is not None and not self.interrupted:
            self.journal.add(*records)

    def _needs_durable_intent(self, step: Step) -> bool:
        """Whether ``step`` must wait for its intent's commit before its side effect starts.

        An idempotent step (a cross-agent step, or a tool the runner's ``is_idempotent`` names)
        of a plan without a budget need not: its intent still precedes its result in the
        journal, and if a crash loses the intent the step looks never started (or in flight) and
        is simply run again, which idempotency makes safe. A budget's reservations must be
        durable before the calls they pay for, so a plan with a budget always waits.
        """
        if self.admission.budget is not None:
            return True
        key = step.tool if isinstance(step, ToolStep) else ""  # "": not a tool (names are not "")
        waits = self.intent_waits.get(key)
        if waits is None:
            waits = self.intent_waits[key] = not self._is_idempotent(step)
        return waits

    def _succeed(self, step_id: str, output: Any, attempt: int, output_json: str | None) -> None:
        self.outputs[step_id] = output
        self.statuses[step_id] = StepStatus.SUCCEEDED
        if self.journal is not None and not self.interrupted:
            plan = self.plan
            result = StepResult(
                plan.id, plan.revision, step_id, attempt, StepStatus.SUCCEEDED, output_json
            )
            if self.steps[step_id].compensate is None:
                self.journal.add(result)
            else:  # the need to compensate is committed with the success, in one transaction
                self.journal.add(
                    result,
                    CompensationRecord(plan.id, plan.revision, step_id, CompensationStatus.NEEDED),
                )
        if self.steps[step_id].compensate is not None:
            self.compensable.append(step_id)
            self.compensation[step_id] = CompensationStatus.NEEDED
        self._emit(step_id, StepStatus.SUCCEEDED, attempt)

    def _fail(self, step_id: str, failure_class: FailureClass, message: str, attempts: int) -> None:
        plan = self.plan
        self.failures.append(StepFailure(step_id, failure_class, message, attempts))
        self.statuses[step_id] = StepStatus.FAILED
        self._record(
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
        self._emit(step_id, StepStatus.FAILED, attempts, failure_class, message)

    def _skip_pending(self) -> None:
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
            self._emit(step.id, StepStatus.SKIPPED, 0, message=message)

    def _is_idempotent(self, step: Step) -> bool:
        match step:
            case CrossAgentStep():
                return True  # the target answers a repeated request id from its store
            case ToolStep():
                return self.tools.is_idempotent(step.tool)
            case GateStep():
                return True
            case _:
                assert_never(step)

    def _start_ready(self) -> None:
        """Start the ready steps (the scheduler, ``_run._PlanRun``, defines it)."""
        raise NotImplementedError
