"""The engine: runs a plan's steps in dependency order, bounded, timed, retried and traced.

Scheduling is Kahn's algorithm driven by completions: every step whose dependencies have succeeded
starts as soon as a slot is free (``plan.max_in_flight``, else ``EngineConfig.max_in_flight``), and
each completion starts the steps it unblocks at once, not layer by layer. A step waiting out a
retry backoff keeps its slot.

Each attempt has a time limit (``step.timeout_s``, else ``EngineConfig.default_timeout_s``); when it
runs out the attempt is cancelled and fails with class ``timeout``. The limits of one run share one
event-loop timer (see ``_Watchdog``) with the semantics of ``asyncio.timeout``.

Tracing: a span ``invoke_agent {agent}`` per run, ``step {id}`` per attempt and ``execute_tool
{tool}`` per tool call; a cross-agent step dispatches inside its step span, so the client's span is
its child. Step and tool spans are made only when the run span is recording.

Failure handling is fail-fast. When a step fails for good (its class is not retried, or it ran out
of attempts), the engine starts nothing new and cancels the steps still running, so the plan ends
promptly; compensation of what already succeeded is a separate concern. At the end:

- a step that started and was interrupted is ``cancelled``;
- a step that never started is ``skipped``;
- the plan is ``failed`` and ``PlanResult.failures`` lists the steps that failed (not the ones
  cancelled or skipped because of them).

When the task running ``Engine.run`` is itself cancelled, the running steps are cancelled and
awaited, every step gets its final event (``cancelled`` or ``skipped``), the plan's final event is
``cancelled``, and ``asyncio.CancelledError`` propagates.

Events: every transition emits a ``StepEvent`` to ``on_event``, synchronously and in order. For a
plan: ``running`` first and its final status last (``step_id == ""``). For a step: ``running``
(attempt 1), then per failed, retried attempt ``retrying`` (with the failure, ``delay_s`` and the
delay in the message) followed by ``running`` for the next attempt, then exactly one of
``succeeded``, ``failed``, ``cancelled`` or ``skipped`` (a ``skipped`` step has no ``running``).
An exception from ``on_event`` is logged and otherwise ignored: observers cannot change a run.

Backoff jitter comes from a ``random.Random`` seeded from ``EngineConfig.seed`` and the step's run
id, so the same plan and seed give the same delays however the steps interleave.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, Generic, Protocol, TypeVar, assert_never

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, TracerProvider
from pydantic import ValidationError

from planning._dag import structural_problems
from planning._dispatch import CrossAgentCall, Dispatcher, step_run_id
from planning._errors import (
    LogicError,
    PlanFailedError,
    PlanningError,
    PlanValidationError,
    StepError,
    StepFailure,
    failure_class_for_code,
    field_problems,
)
from planning._plan import (
    CrossAgentStep,
    FailureClass,
    Plan,
    PlanStatus,
    RetryPolicy,
    Step,
    StepStatus,
    ToolStep,
)
from planning._refs import has_refs, kind_of, resolve_refs
from protocol import RemoteError, capability_for

__all__ = [
    "Engine",
    "EngineConfig",
    "PlanResult",
    "StepEvent",
    "ToolContext",
    "ToolRunner",
]

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)
T = TypeVar("T")

_RETRYABLE: Final = frozenset({FailureClass.TRANSIENT, FailureClass.TIMEOUT})
_CLOCK_RESOLUTION: Final = time.get_clock_info("monotonic").resolution
_TRACER_NAME: Final = "stratagem.planning"
_FAILURE_CLASS_ATTR: Final = "stratagem.failure.class"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How an engine runs plans.

    Attributes:
        max_in_flight: Steps running at once, unless the plan sets its own ``max_in_flight``.
        default_timeout_s: The limit on one attempt of a step without its own ``timeout_s``.
        seed: Seeds the backoff jitter; the same seed gives the same delays.
    """

    max_in_flight: int = 4
    default_timeout_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {self.max_in_flight}")
        if not self.default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be positive, not {self.default_timeout_s}")


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the step attempt it serves.

    Attributes:
        plan_id: The plan.
        step_id: The step.
        attempt: The attempt number, from 1.
        agent: The role of the agent running the plan.
        revision: The plan's revision.
    """

    plan_id: str
    step_id: str
    attempt: int
    agent: str
    revision: int = 1

    @property
    def call_id(self) -> str:
        """The step's run id, ``f"{plan_id}@{revision}:{step_id}"``: the same on every attempt."""
        return step_run_id(self.plan_id, self.revision, self.step_id)


class ToolRunner(Protocol):
    """Runs a named tool of the agent (``agents.ToolRegistry`` implements it).

    The runner validates ``input`` against the tool's own model; the engine passes it as planned
    (references resolved) and never copies it, so a tool must not mutate it.
    """

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run tool ``name`` and return its JSON-like output.

        Raises:
            StepError: To fail the step with a failure class (``TransientError`` is retried).
        """
        ...


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One transition of a plan or of one of its steps.

    Attributes:
        plan_id: The plan.
        revision: The plan's revision.
        step_id: The step, or "" for the plan itself.
        status: The new status (a ``PlanStatus`` when ``step_id`` is "").
        attempt: The step's attempt (0 for plan events and never-started steps).
        failure_class: The failure's class, for ``retrying``, ``failed`` and ``cancelled``.
        message: A one-line description ("" when there is nothing to add).
        timestamp: Wall-clock time of the transition (``time.time()``).
        delay_s: For ``retrying``: the backoff before the next attempt.
    """

    plan_id: str
    revision: int
    step_id: str
    status: StepStatus | PlanStatus
    attempt: int
    failure_class: FailureClass | None
    message: str
    timestamp: float
    delay_s: float | None = None


@dataclass(frozen=True)
class PlanResult(Generic[P]):
    """How a plan run ended.

    Attributes:
        status: ``succeeded`` or ``failed``.
        outputs: Step id -> output, for every step that succeeded.
        failures: The steps that failed, in the order they failed.
        statuses: Step id -> final status, in plan order.
        events: How many events the run emitted.
        duration_s: Wall time of the run.
        submitted: The plan as it was submitted (unchanged).
    """

    status: PlanStatus
    outputs: dict[str, Any]
    failures: list[StepFailure]
    statuses: dict[str, StepStatus]
    events: int
    duration_s: float
    submitted: P = field(repr=False)

    @cached_property
    def plan(self) -> P:
        """A copy of the submitted plan whose steps carry their final statuses."""
        steps = [
            step
            if step.status is self.statuses[step.id]
            else step.model_copy(update={"status": self.statuses[step.id]})
            for step in self.submitted.steps
        ]
        return self.submitted.model_copy(update={"steps": steps})

    def raise_for_status(self) -> None:
        """Raise ``PlanFailedError`` unless the plan succeeded."""
        if self.status is not PlanStatus.SUCCEEDED:
            raise PlanFailedError(self.submitted.id, self.failures)


def backoff_delay(policy: RetryPolicy, failed_attempt: int, rng: random.Random) -> float:
    """The delay after attempt ``failed_attempt`` (from 1) failed, jittered with ``rng``."""
    base = min(
        policy.max_backoff_s,
        policy.initial_backoff_s * policy.multiplier ** (failed_attempt - 1),
    )
    factor = 1.0 + rng.uniform(-policy.jitter, policy.jitter) if policy.jitter else 1.0
    return min(policy.max_backoff_s, base * factor)


class Engine:
    """Runs plans for one agent.

    An engine holds no per-run state, so one engine may run several plans at once.

    Args:
        config: Scheduling limits and the jitter seed; defaults to ``EngineConfig()``.
        tools: Runs the agent's tools.
        dispatcher: Sends cross-agent steps; without one, such steps fail with a logic failure.
        agent: The role of the agent (names the plan span and every tool call's context).
        tracer_provider: Where spans go; the global provider by default.
        sleep: Waits out retry backoffs (inject a fake one in tests).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        tools: ToolRunner,
        dispatcher: Dispatcher | None = None,
        agent: str,
        tracer_provider: TracerProvider | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        self.agent = agent
        self._tools = tools
        self._dispatcher = dispatcher
        self._sleep = sleep
        self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)

    async def run(
        self, plan: P, *, on_event: Callable[[StepEvent], None] | None = None
    ) -> PlanResult[P]:
        """Run ``plan`` to its end.

        Args:
            plan: The plan; it should have passed ``validate_plan``. Step statuses in it are
                ignored: every step runs.
            on_event: Called with every ``StepEvent``, in order.

        Returns:
            The result: ``succeeded`` or ``failed``, with outputs and failures. Step failures never
            raise; use ``PlanResult.raise_for_status`` for that.

        Raises:
            PlanValidationError: When the steps do not form a DAG (duplicate ids, unknown
                dependencies, a cycle); nothing runs then.
            asyncio.CancelledError: When the calling task is cancelled.
        """
        run = _PlanRun(self, plan, on_event)
        if not run.is_dag():
            raise PlanValidationError(structural_problems(plan.steps))
        return await run.execute()


class _Deadline:
    """One attempt's deadline, as the watchdog and the attempt share it."""

    __slots__ = ("active", "cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.cancelling = task.cancelling()
        self.active = True
        self.expired = False


class _Watchdog:
    """Enforces every attempt deadline of one run with a single event-loop timer.

    ``asyncio.timeout`` costs a timer handle, a heap entry and a cancellation per attempt; on plans
    of short steps that was the largest part of the engine's per-step overhead. Here an attempt
    costs one entry in a heap of ``(when, seq, deadline)``; the timer is armed for the earliest
    entry, and when it fires it cancels the tasks of the expired, still active attempts. Entries of
    finished attempts stay in the heap until their time passes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def arm(self, task: asyncio.Task[Any], limit_s: float) -> _Deadline:
        """Cancel ``task`` in ``limit_s`` seconds unless the returned deadline is deactivated."""
        deadline = _Deadline(task)
        when = self._loop.time() + limit_s
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, deadline))
        if when < self._timer_at:
            self._schedule(when)
        return deadline

    def close(self) -> None:
        """Stop the timer (at the end of the run)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._heap.clear()

    def _schedule(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self._loop.time() + _CLOCK_RESOLUTION  # the loop may run a timer this early
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline = heapq.heappop(heap)[2]
            if deadline.active:
                deadline.expired = True
                deadline.task.cancel()
        if heap:
            self._schedule(heap[0][0])


@dataclass(slots=True)
class _Outcome:
    output: dict[str, Any] | None
    failure_class: FailureClass | None
    message: str
    attempts: int


class _PlanRun(Generic[P]):
    """The state of one run of one plan.

    Everything runs on the event loop's thread: the step tasks and the done-callbacks that settle
    them update this state only between awaits, so it needs no locks.
    """

    def __init__(
        self, engine: Engine, plan: P, on_event: Callable[[StepEvent], None] | None
    ) -> None:
        self.plan = plan
        self.on_event = on_event
        self.tracer = engine._tracer
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

    # --- the scheduler -----------------------------------------------------------------------

    async def execute(self) -> PlanResult[P]:
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
                "stratagem.plan.id": plan.id,
                "stratagem.plan.revision": plan.revision,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            # Step and tool spans are made only under a recording plan span: a no-op tracer
            # (no provider set up) or a sampled-out plan then costs nothing per step.
            self.tracing = span.is_recording()
            self._emit("", PlanStatus.RUNNING, 0)
            try:
                await self._schedule()
            except asyncio.CancelledError:
                span.set_attribute("stratagem.plan.status", PlanStatus.CANCELLED.value)
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                self._emit("", PlanStatus.CANCELLED, 0, message="the plan run was cancelled")
                logger.info("plan %s@%d: cancelled", plan.id, plan.revision)
                raise
            finally:
                self.watchdog.close()
            status = PlanStatus.FAILED if self.failures else PlanStatus.SUCCEEDED
            message = _summary(self.failures)
            span.set_attribute("stratagem.plan.status", status.value)
            if self.failures:
                span.set_status(Status(StatusCode.ERROR, message))
            self._emit("", status, 0, message=message)
        duration = time.monotonic() - started
        logger.info("plan %s@%d: %s in %.3fs", plan.id, plan.revision, status.value, duration)
        return PlanResult(
            status=status,
            outputs=self.outputs,
            failures=self.failures,
            statuses=self.statuses,
            events=self.events,
            duration_s=duration,
            submitted=plan,
        )

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

    async def _schedule(self) -> None:
        self.ready.extend(step_id for step_id, count in self.waiting.items() if count == 0)
        # Completions are handled in task done-callbacks rather than by this coroutine waking up
        # for each one: scheduling the next steps then costs no extra event-loop round trip.
        self.callback_context = contextvars.copy_context()  # inside the plan span
        self._start_ready()
        try:
            if self.running:
                await self.finished
        except asyncio.CancelledError:
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
        self._skip_pending()

    def _start_ready(self) -> None:
        ready, running, statuses = self.ready, self.running, self.statuses
        while ready and len(running) < self.bound and not self.stop_reason:
            step_id = ready.popleft()
            statuses[step_id] = StepStatus.RUNNING
            self.attempts[step_id] = 1
            self._emit(step_id, StepStatus.RUNNING, 1)
            task = self.loop.create_task(self._execute(self.steps[step_id]))
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
                waiting = self.waiting
                for dependent in self.dependents[step_id]:
                    waiting[dependent] -= 1
                    if waiting[dependent] == 0:
                        self.ready.append(dependent)
            elif not self.stop_reason and not task.cancelled():
                self.stop_reason = f"the plan stopped after step {step_id!r} failed"
                for other in self.running:
                    other.cancel()
            self._start_ready()
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            if finished.done():
                raise
            finished.set_exception(exc)
            return
        if not self.running and not finished.done():
            finished.set_result(None)

    def _settle(self, step_id: str, task: asyncio.Task[_Outcome]) -> bool:
        """Record a finished step task; True when the step succeeded."""
        attempts = self.attempts[step_id]
        if task.cancelled():
            self.statuses[step_id] = StepStatus.CANCELLED
            message = self.stop_reason or "cancelled"
            self._emit(step_id, StepStatus.CANCELLED, attempts, FailureClass.CANCELLED, message)
            return False
        exc = task.exception()
        if exc is None:
            outcome = task.result()
        else:  # the step runner catches every Exception; this is a bug in the engine
            logger.error("step %s raised out of the engine", step_id, exc_info=exc)
            outcome = _Outcome(None, FailureClass.LOGIC, f"{type(exc).__name__}: {exc}", attempts)
        if outcome.failure_class is None:
            self.outputs[step_id] = outcome.output
            self.statuses[step_id] = StepStatus.SUCCEEDED
            self._emit(step_id, StepStatus.SUCCEEDED, attempts)
            return True
        self.failures.append(
            StepFailure(step_id, outcome.failure_class, outcome.message, outcome.attempts)
        )
        self.statuses[step_id] = StepStatus.FAILED
        logger.warning(
            "plan %s step %s failed (%s) after %d attempt(s): %s",
            self.plan.id,
            step_id,
            outcome.failure_class.value,
            outcome.attempts,
            outcome.message,
        )
        self._emit(step_id, StepStatus.FAILED, attempts, outcome.failure_class, outcome.message)
        return False

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

    def _emit(
        self,
        step_id: str,
        status: StepStatus | PlanStatus,
        attempt: int,
        failure_class: FailureClass | None = None,
        message: str = "",
        delay_s: float | None = None,
    ) -> None:
        self.events += 1
        if self.on_event is None:
            return
        event = StepEvent(
            self.plan.id,
            self.plan.revision,
            step_id,
            status,
            attempt,
            failure_class,
            message,
            time.time(),
            delay_s,
        )
        try:
            self.on_event(event)
        except Exception:
            logger.exception("on_event failed for plan %s event %s", self.plan.id, event)

    # --- one step ----------------------------------------------------------------------------

    async def _execute(self, step: Step) -> _Outcome:
        """Attempt ``step`` until it succeeds, fails for good or is cancelled."""
        timeout = step.timeout_s or self.default_timeout
        attempt = 1
        rng: random.Random | None = None
        run_attempt = self._attempt if self.tracing else self._attempt_body
        while True:
            output, failure_class, message = await run_attempt(step, attempt, timeout)
            if failure_class is None:
                return _Outcome(output, None, "", attempt)
            if failure_class not in _RETRYABLE or attempt >= step.retry.max_attempts:
                return _Outcome(None, failure_class, message, attempt)
            if rng is None:
                rng = random.Random(
                    f"{self.seed}:{step_run_id(self.plan.id, self.plan.revision, step.id)}"
                )
            delay = backoff_delay(step.retry, attempt, rng)
            self.statuses[step.id] = StepStatus.RETRYING
            self._emit(
                step.id,
                StepStatus.RETRYING,
                attempt,
                failure_class,
                f"{message}; retrying in {delay:.3f}s",
                delay,
            )
            await self.sleep(delay)
            attempt += 1
            self.attempts[step.id] = attempt
            self.statuses[step.id] = StepStatus.RUNNING
            self._emit(step.id, StepStatus.RUNNING, attempt)

    async def _attempt(
        self, step: Step, attempt: int, limit_s: float
    ) -> tuple[dict[str, Any] | None, FailureClass | None, str]:
        """One attempt, in its own span: (output, None, "") or (None, class, message)."""
        with self.tracer.start_as_current_span(
            f"step {step.id}",
            attributes={
                "stratagem.plan.id": self.plan.id,
                "stratagem.step.id": step.id,
                "stratagem.step.kind": step.kind,
                "stratagem.step.attempt": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                output, failure_class, message = await self._attempt_body(step, attempt, limit_s)
            except asyncio.CancelledError:
                _fail_span(span, FailureClass.CANCELLED, "cancelled")
                raise
            if failure_class is not None:
                _fail_span(span, failure_class, message)
            return output, failure_class, message

    async def _attempt_body(
        self, step: Step, attempt: int, limit_s: float
    ) -> tuple[dict[str, Any] | None, FailureClass | None, str]:
        """One attempt without a span of its own."""
        try:
            match step:
                case ToolStep():
                    return await self._run_tool(step, attempt, limit_s), None, ""
                case CrossAgentStep():
                    return await self._run_cross_agent(step, attempt, limit_s), None, ""
                case _:
                    assert_never(step)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            # Cancelled work this task did not ask to stop (e.g. a future cancelled elsewhere).
            failure_class, message = FailureClass.CANCELLED, "the step's work was cancelled"
        except Exception as exc:
            failure_class, message = _classify(exc, limit_s)
        logger.debug(
            "plan %s step %s attempt %d: %s: %s",
            self.plan.id,
            step.id,
            attempt,
            failure_class.value,
            message,
        )
        return None, failure_class, message

    async def _limited(self, work: Awaitable[T], limit_s: float) -> T:
        """Await ``work``, raising ``TimeoutError`` when it takes longer than ``limit_s``.

        The semantics of ``asyncio.timeout`` (the expiry cancels the task, the cancellation
        becomes ``TimeoutError``, a cancellation from elsewhere still propagates), but with the
        run's one shared timer instead of a timer per attempt.
        """
        task = asyncio.current_task()
        assert task is not None  # always inside a step task
        deadline = self.watchdog.arm(task, limit_s)
        try:
            result = await work
        except asyncio.CancelledError:
            if deadline.expired and task.uncancel() <= deadline.cancelling:
                raise TimeoutError from None
            raise
        else:
            if deadline.expired:  # the work swallowed the expiry's cancellation
                task.uncancel()
            return result
        finally:
            deadline.active = False

    async def _run_tool(self, step: ToolStep, attempt: int, limit_s: float) -> dict[str, Any]:
        tool_input = step.input
        if has_refs(tool_input):
            tool_input = resolve_refs(tool_input, self.outputs)
            if not isinstance(tool_input, dict):
                raise LogicError(f"the input resolves to {kind_of(tool_input)}, not an object")
        ctx = ToolContext(self.plan.id, step.id, attempt, self.agent, self.plan.revision)
        if not self.tracing:
            output = await self._limited(self.tools.run_tool(step.tool, tool_input, ctx), limit_s)
        else:
            with self.tracer.start_as_current_span(
                f"execute_tool {step.tool}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": step.tool,
                    "gen_ai.tool.call.id": ctx.call_id,
                },
            ):
                output = await self._limited(
                    self.tools.run_tool(step.tool, tool_input, ctx), limit_s
                )
        if not isinstance(output, dict):
            raise LogicError(f"tool {step.tool!r} returned {kind_of(output)}, not a dict")
        return output

    async def _run_cross_agent(
        self, step: CrossAgentStep, attempt: int, limit_s: float
    ) -> dict[str, Any]:
        spec = capability_for(step.target, step.capability)
        if spec is None:
            raise LogicError(f"the {step.target} agent does not serve {step.capability!r}")
        dispatcher = self.dispatcher
        if dispatcher is None:
            raise LogicError(f"the {self.agent} agent's engine has no dispatcher")
        data = resolve_refs(step.request, self.outputs)
        if not isinstance(data, dict):
            raise LogicError(f"the request resolves to {kind_of(data)}, not an object")
        try:
            request = spec.request.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(field_problems(exc))
            raise LogicError(f"invalid {spec.name} request: {problems}") from exc
        call = CrossAgentCall(
            target=step.target,
            capability=step.capability,
            request=request,
            plan_id=self.plan.id,
            step_id=step.id,
            request_id=step_run_id(self.plan.id, self.plan.revision, step.id),
            timeout_s=limit_s,
            attempt=attempt,
            caller=self.agent,
        )
        response = await self._limited(dispatcher.dispatch(call), limit_s)
        if not isinstance(response, spec.response):
            raise LogicError(
                f"the {step.target} agent answered {spec.name} with "
                f"{type(response).__name__}, not {spec.response.__name__}"
            )
        return response.model_dump(mode="json")


def _fail_span(span: Span, failure_class: FailureClass, message: str) -> None:
    span.set_attribute(_FAILURE_CLASS_ATTR, failure_class.value)
    span.set_status(Status(StatusCode.ERROR, message))


def _classify(exc: Exception, timeout: float) -> tuple[FailureClass, str]:
    """The failure class and one-line message of an exception out of a step attempt."""
    if isinstance(exc, StepError):
        return exc.failure_class, exc.message
    if isinstance(exc, RemoteError):
        return failure_class_for_code(exc.code), str(exc)
    if isinstance(exc, TimeoutError):
        detail = str(exc)
        return FailureClass.TIMEOUT, (
            f"TimeoutError: {detail}" if detail else f"timed out after {timeout:g}s"
        )
    if isinstance(exc, PlanningError):
        return FailureClass.LOGIC, str(exc)
    if isinstance(exc, ValidationError):
        return FailureClass.LOGIC, f"ValidationError: {'; '.join(field_problems(exc))}"
    return FailureClass.LOGIC, f"{type(exc).__name__}: {exc}"


def _summary(failures: list[StepFailure]) -> str:
    if not failures:
        return ""
    first = failures[0]
    text = f"step {first.step_id!r} failed ({first.failure_class.value}): {first.message}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    return text
