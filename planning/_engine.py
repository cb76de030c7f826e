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
its child. Retries, gate openings and decisions and compensations are events on the run span
(``retry``, ``gate.blocked``, ``gate.decided``, ``compensation``). Step and tool spans and the
events are made only when the run span is recording (``docs/telemetry.md`` has the whole model).

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

Durability (only with ``Engine(store=...)``; ``docs/durability.md`` has the whole story): a run's
records go through a ``_Journal`` that commits each tick's records in one transaction; a step task
awaits the commit of its intent before calling its tool or dispatching, and ``run`` returns after
the final status is committed. With a store, cancelling the task running ``run`` is an
interruption (nothing more is recorded; ``resume`` continues), while ``Engine.cancel`` cancels the
plan for good and compensates. Gate steps and reconcile gates hold the plan ``blocked`` until
``Engine.decide``; when a plan fails or is cancelled, the compensations of succeeded steps run in
reverse completion order before the final status. An idempotent step of a plan without a budget
does not wait for its intent's commit (``_PlanRun._needs_durable_intent`` says why that is safe).

Failure policy: ``transient`` and ``timeout`` are retried; ``logic`` stops the run, and with a
``replanner`` the engine makes a new revision (``planning._revisions``) and continues with it;
``policy`` fails the plan, or holds a step with ``on_policy_failure="gate"`` at a policy gate.
Budgets (``Plan.budget``) are reserved before each attempt, and per-tool circuit breakers
(``CircuitBreakerConfig``) refuse attempts of a failing tool; both fail with class ``policy``.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import inspect
import json
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Final, Generic, Protocol, TypeVar, assert_never, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)
from pydantic import ValidationError

from stratagem.planning._dag import structural_problems
from stratagem.planning._dispatch import CrossAgentCall, Dispatcher, step_run_id
from stratagem.planning._errors import (
    GateDecisionError,
    LogicError,
    PlanControlError,
    PlanFailedError,
    PlanningError,
    PlanValidationError,
    StepError,
    StepFailure,
    StoreError,
    failure_class_for_code,
    field_problems,
)
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    Plan,
    PlanStatus,
    RetryPolicy,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._refs import has_refs, kind_of, resolve_refs
from stratagem.planning._revisions import (
    Replanner,
    Revision,
    RevisionRecord,
    diff_plans,
    unchanged_steps,
)
from stratagem.planning._store import (
    BreakerState,
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
    PlanState,
    PlanStatusRecord,
    Record,
    StateStore,
    StepIntent,
    StepResult,
    fold,
)
from stratagem.protocol import RemoteError, capability_for

__all__ = [
    "CircuitBreakerConfig",
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
# Step statuses counted as a step's outcome (``stratagem.steps``).
_SETTLED: Final = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)
_CLOCK_RESOLUTION: Final = time.get_clock_info("monotonic").resolution
_TRACER_NAME: Final = "stratagem.planning"
_FAILURE_CLASS_ATTR: Final = "stratagem.failure.class"
# Step statuses that are a ``compensation`` span event, and the event's status attribute.
_COMPENSATION_EVENT: Final = {
    StepStatus.COMPENSATING: "running",
    StepStatus.COMPENSATED: "compensated",
    StepStatus.COMPENSATION_FAILED: "failed",
}


@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    """When a tool's circuit breaker opens and for how long.

    The breaker counts a tool's consecutive failed attempts (``transient`` and ``timeout``
    failures, across every plan of the engine; a success resets the count). At
    ``failure_threshold`` it opens: attempts of steps calling the tool fail with a ``policy``
    failure without calling it. After ``reset_after_s`` one more call is let through (half-open):
    a success closes the breaker, a failure opens it again for another ``reset_after_s``. With a
    store the breaker is persisted, so a restart does not reset it.

    Attributes:
        failure_threshold: Consecutive failures that open the breaker.
        reset_after_s: How long it stays open.
    """

    failure_threshold: int = 5
    reset_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, not {self.failure_threshold}")
        if self.reset_after_s < 0:
            raise ValueError(f"reset_after_s must not be negative, not {self.reset_after_s}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How an engine runs plans.

    Attributes:
        max_in_flight: Steps running at once, unless the plan sets its own ``max_in_flight``.
        default_timeout_s: The limit on one attempt of a step without its own ``timeout_s``.
        seed: Seeds the backoff jitter; the same seed gives the same delays.
        max_replans: How many new revisions the engine's ``replanner`` may make in one run
            after logic failures.
        circuit_breaker: The per-tool circuit breakers; ``None`` turns them off.
    """

    max_in_flight: int = 4
    default_timeout_s: float = 30.0
    seed: int = 0
    max_replans: int = 1
    circuit_breaker: CircuitBreakerConfig | None = CircuitBreakerConfig()

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {self.max_in_flight}")
        if not self.default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be positive, not {self.default_timeout_s}")
        if self.max_replans < 0:
            raise ValueError(f"max_replans must not be negative, not {self.max_replans}")


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the step attempt it serves.

    Attributes:
        plan_id: The plan.
        step_id: The step.
        attempt: The attempt number, from 1.
        agent: The role of the agent running the plan.
        revision: The plan's revision.
        compensating: True when the call runs the step's compensating tool (``attempt`` then
            counts the compensation's attempts).
    """

    plan_id: str
    step_id: str
    attempt: int
    agent: str
    revision: int = 1
    compensating: bool = False

    @property
    def call_id(self) -> str:
        """The step's run id, ``f"{plan_id}@{revision}:{step_id}"``: the same on every attempt."""
        return step_run_id(self.plan_id, self.revision, self.step_id)


class ToolRunner(Protocol):
    """Runs a named tool of the agent (``agents.ToolRegistry`` implements it).

    The runner validates ``input`` against the tool's own model; the engine passes it as planned
    (references resolved) and never copies it, so a tool must not mutate it.

    A runner may also define ``is_idempotent(name: str) -> bool`` (``agents.ToolRegistry`` does):
    when resuming a plan, a tool step that was in flight at the crash is re-run only when its tool
    is idempotent; a runner without the method has no idempotent tools, and such a step waits at
    a reconcile gate. It is optional, so it is not part of this protocol's required members.

    Likewise an optional ``cost(name: str) -> float``: the cost units a call of the tool reserves
    from a plan's budget (1.0 when the runner has no such method).
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
        status: ``succeeded``, ``failed``, ``cancelled`` (``Engine.cancel``) or ``paused``
            (``Engine.pause``; unstarted steps stay ``pending``).
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
    """Runs plans for one agent, durably when given a store.

    An engine may run several plans at once. It keeps a registry of its active runs by plan id, so
    ``decide``, ``pause`` and ``cancel`` reach a run while ``run`` or ``resume`` is awaiting it
    (call them from the same event loop). With a ``store``, every transition is committed before
    it is acted on, and ``resume`` continues a plan a crash interrupted (``docs/durability.md``);
    without one, the engine behaves as it always did and keeps nothing.

    Args:
        config: Scheduling limits and the jitter seed; defaults to ``EngineConfig()``.
        tools: Runs the agent's tools.
        dispatcher: Sends cross-agent steps; without one, such steps fail with a logic failure.
        agent: The role of the agent (names the plan span and every tool call's context).
        agent_id: ``gen_ai.agent.id`` on the plan span; the role by default (one agent per role).
        tracer_provider: Where spans go; the global provider by default.
        sleep: Waits out retry backoffs (inject a fake one in tests).
        store: Where plans and their journals are kept; ``None`` keeps nothing (no resume).
        replanner: Asked for a new revision when a run stops on a ``logic`` failure (at most
            ``config.max_replans`` times per run); ``None`` lets such a plan fail.
        clock: Wall-clock time (``time.time``) for budgets and circuit breakers; inject a fake
            one in tests.
        meter_provider: Where plan, step and retry counts go (``PlanningMetrics``); the global
            provider by default.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        tools: ToolRunner,
        dispatcher: Dispatcher | None = None,
        agent: str,
        agent_id: str = "",
        tracer_provider: TracerProvider | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        store: StateStore | None = None,
        replanner: Replanner | None = None,
        clock: Callable[[], float] = time.time,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        self.agent = agent
        self.agent_id = agent_id or agent
        self.store = store
        self.replanner = replanner
        self.clock = clock
        self._tools = tools
        self._dispatcher = dispatcher
        self._sleep = sleep
        self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)
        self._metrics = PlanningMetrics(meter_provider)
        self._runs: dict[str, _PlanRun[Any]] = {}
        self._breakers: dict[str, BreakerState] = {}
        self._breakers_loaded = store is None

    async def run(
        self, plan: P, *, on_event: Callable[[StepEvent], None] | None = None
    ) -> PlanResult[P]:
        """Run ``plan`` until it ends, pauses or is cancelled.

        A gate step makes the run wait (plan status ``blocked``) until ``decide`` is called.

        Args:
            plan: The plan; it should have passed ``validate_plan``. Step statuses in it are
                ignored: every step runs.
            on_event: Called with every ``StepEvent``, in order.

        Returns:
            The result: ``succeeded``, ``failed``, ``cancelled`` (``cancel``) or ``paused``
            (``pause``), with outputs and failures. Step failures never raise; use
            ``PlanResult.raise_for_status`` for that.

        Raises:
            PlanValidationError: When the steps do not form a DAG (duplicate ids, unknown
                dependencies, a cycle); nothing runs then.
            PlanControlError: With a store: when the plan (id and revision) is already stored or
                running; ``resume`` it instead.
            StoreError: When the store fails; the run stops where it was and can be resumed.
            asyncio.CancelledError: When the calling task is cancelled. With a store this is an
                interruption, not a cancellation: nothing more is recorded and ``resume``
                continues the plan (``cancel`` cancels a plan for good).
        """
        run = _PlanRun(self, plan, on_event)
        if not run.is_dag():
            raise PlanValidationError(structural_problems(plan.steps))
        if self.store is not None:
            if plan.id in self._runs:
                raise PlanControlError(plan.id, f"plan {plan.id!r} is already running")
            if not await self.store.save_plan(plan):
                raise PlanControlError(
                    plan.id,
                    f"plan {plan.id!r} revision {plan.revision} is already in the store; "
                    f"resume it instead",
                )
        await self._load_breakers()
        return await self._execute(run)

    async def resume(
        self,
        plan_id: str,
        *,
        plan_type: type[Plan] = Plan,
        on_event: Callable[[StepEvent], None] | None = None,
    ) -> PlanResult[Plan]:
        """Continue a stored plan from its journal (after a crash, a pause or an interruption).

        Completed steps are not run again (their recorded outputs feed references); a step that
        was in flight is re-run when it is idempotent (a cross-agent step, or a tool the runner's
        ``is_idempotent`` says is), and otherwise waits at a reconcile gate named after it. Gate
        decisions and cancellations recorded while no engine ran are honoured; an interrupted
        compensation continues. A plan already finished is not run: its recorded result is
        returned.

        Args:
            plan_id: The plan.
            plan_type: The class to load the stored plan as (fields it lacks are dropped).
            on_event: Called with every ``StepEvent``, in order.

        Returns:
            The result, as ``run`` returns it.

        Raises:
            PlanControlError: When the engine has no store, the plan is unknown or already
                running here.
            StoreError: When the store fails.
            asyncio.CancelledError: When the calling task is cancelled (an interruption).
        """
        store = self._require_store(plan_id, "resume")
        if plan_id in self._runs:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is already running")
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        run: _PlanRun[Plan] = _PlanRun(self, state.plan(plan_type), on_event)
        if not run.is_dag():
            raise PlanValidationError(structural_problems(run.plan.steps))
        if state.status.is_final:
            return run.recorded_result(state)
        logger.info("plan %s@%d: resuming from %s", plan_id, state.revision, state.status.value)
        run.restore(state)
        await self._load_breakers()
        return await self._execute(run)

    async def decide(
        self,
        plan_id: str,
        gate_id: str,
        *,
        approve: bool,
        approver: str,
        rationale: str,
        revision: int,
        output: dict[str, Any] | None = None,
    ) -> None:
        """Approve or reject a gate; the decision is recorded before it is acted on.

        For a gate step, approval lets its dependents run and rejection fails it (class
        ``policy``) and so the plan. For a reconcile gate (named after a step that was in flight
        when the plan stopped), approval re-runs the step, or, with ``output``, records the step
        as succeeded with that output without running it (the operator found its effect done);
        rejection fails the step.

        A plan running here is woken at once. Otherwise the decision is stored and the next
        ``resume`` acts on it; a gate step's decision may then be given before the gate is
        reached.

        Args:
            plan_id: The plan.
            gate_id: The gate step's id, or the reconciled step's id.
            approve: Approve (True) or reject (False).
            approver: Who decides.
            rationale: Why.
            revision: The plan revision the decision is given for; it must be the plan's current
                revision.
            output: For a reconcile gate only: the step's output, to record instead of re-running.

        Raises:
            GateDecisionError: When the gate is unknown, already decided or not open, the revision
                is not the plan's, or ``output`` is given for a gate step.
            PlanControlError: When the plan is neither running here nor in the store.
            StoreError: When the store fails.
        """
        output_json = None if output is None else json.dumps(output)
        run = self._runs.get(plan_id)
        if run is not None:
            kind = run.check_decision(gate_id, revision, output)
            record = GateRecord(
                plan_id,
                revision,
                gate_id,
                GateDecision.APPROVED if approve else GateDecision.REJECTED,
                kind,
                approver=approver,
                rationale=rationale,
                output_json=output_json,
            )
            if self.store is not None:
                await self.store.commit([record])
            run.apply_decision(gate_id, approve, approver, rationale, output)
            return
        store = self._require_store(plan_id, "decide a gate of")
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        kind = _check_stored_decision(state, gate_id, revision, output)
        await store.commit(
            [
                GateRecord(
                    plan_id,
                    revision,
                    gate_id,
                    GateDecision.APPROVED if approve else GateDecision.REJECTED,
                    kind,
                    approver=approver,
                    rationale=rationale,
                    output_json=output_json,
                )
            ]
        )
        logger.info(
            "plan %s gate %s %s by %s (stored)",
            plan_id,
            gate_id,
            "approved" if approve else "rejected",
            approver,
        )

    async def pause(self, plan_id: str) -> None:
        """Pause a plan: no new step starts, running ones finish, the status becomes ``paused``.

        A plan running here ends its ``run`` (or ``resume``) with status ``paused`` once its
        running steps finish; ``resume`` continues it. A stored plan not running here is marked
        ``paused``.

        Raises:
            PlanControlError: When the plan is finished, or neither running here nor stored.
        """
        run = self._runs.get(plan_id)
        if run is not None:
            run.pause()
            return
        store = self._require_store(plan_id, "pause")
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        if state.status.is_final:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is already {state.status.value}")
        await store.commit([PlanStatusRecord(plan_id, state.revision, PlanStatus.PAUSED)])

    async def cancel(self, plan_id: str) -> None:
        """Cancel a plan for good: running tools and dispatches get ``CancelledError``, completed
        steps are compensated, and the status becomes ``cancelled``.

        For a plan running here, this returns once the cancellation is recorded; its ``run`` (or
        ``resume``) returns the ``cancelled`` result after compensating. A stored plan not running
        here is cancelled and compensated before this returns.

        Raises:
            PlanControlError: When the plan is finished, or neither running here nor stored.
            StoreError: When the store fails.
        """
        run = self._runs.get(plan_id)
        if run is not None:
            if self.store is not None:
                await self.store.commit([ControlRecord(plan_id, run.plan.revision)])
            run.cancel()
            return
        store = self._require_store(plan_id, "cancel")
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        if state.status.is_final:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is already {state.status.value}")
        await store.commit([ControlRecord(plan_id, state.revision)])
        await self.resume(plan_id)

    async def replan(
        self, plan_id: str, new_plan: Plan, *, rationale: str, author: str
    ) -> Revision:
        """Make a new revision of a stored plan that is not running here; ``resume`` runs it.

        The new revision is ``new_plan`` with the plan's id and the stored revision + 1 (step
        statuses reset). It is stored with its parent, its diff and ``rationale``; the results of
        the parent's completed steps that are unchanged (``planning._revisions``) carry over, so
        they do not run again. Old revisions are never changed. The new revision has a budget
        account of its own (``new_plan.budget``).

        Args:
            plan_id: The plan.
            new_plan: The steps (and fields) of the new revision.
            rationale: Why the plan changes.
            author: Who changes it.

        Returns:
            The new revision: its plan and its history entry.

        Raises:
            PlanControlError: When the engine has no store, the plan is unknown, running here
                (pause it first), or stopped with a step in flight (resume it to settle that step
                first).
            PlanValidationError: When the new steps do not form a DAG.
            StoreError: When the store fails.
        """
        store = self._require_store(plan_id, "replan")
        if plan_id in self._runs:
            raise PlanControlError(
                plan_id, f"plan {plan_id!r} is running; pause it before replanning"
            )
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        in_flight = [step_id for step_id, s in state.steps.items() if s.in_flight]
        if in_flight and not state.status.is_final:
            # Its effect is unknown, and a new revision gives it a new idempotency key: settle
            # it first (resume, and decide its reconcile gate), then replan.
            raise PlanControlError(
                plan_id,
                f"step {in_flight[0]!r} of plan {plan_id!r} was in flight when the plan stopped; "
                f"resume the plan to settle it before replanning",
            )
        old = state.plan(type(new_plan))
        attempts = {step_id: s.attempt for step_id, s in state.steps.items()}
        compensations = {c.step_id: c.status for c in state.compensations}
        revision, _ = await self._revise(
            old,
            new_plan,
            state.outputs,
            attempts,
            compensations,
            rationale,
            author,
            spent=(state.spent_calls, state.spent_cost),
        )
        logger.info(
            "plan %s: revision %d made by %s: %s", plan_id, revision.revision, author, rationale
        )
        return revision

    async def _revise(
        self,
        old: Plan,
        new: Plan,
        outputs: dict[str, Any],
        attempts: dict[str, int],
        compensations: dict[str, CompensationStatus],
        rationale: str,
        author: str,
        *,
        spent: tuple[int, float] = (0, 0.0),
    ) -> tuple[Revision, PlanState]:
        """Make (and store) the revision after ``old``; its state holds the carried results and
        what earlier revisions spent of the plan's budget."""
        steps = [
            step
            if step.status is StepStatus.PENDING
            else step.model_copy(update={"status": StepStatus.PENDING})
            for step in new.steps
        ]
        plan = new.model_copy(update={"id": old.id, "revision": old.revision + 1, "steps": steps})
        problems = structural_problems(plan.steps)
        if problems:
            raise PlanValidationError(problems)
        same = unchanged_steps(old, plan)
        carried = [step.id for step in plan.steps if step.id in same and step.id in outputs]
        records: list[Record] = []
        if spent != (0, 0.0):
            records.append(BudgetRecord(plan.id, plan.revision, spent[0], spent[1]))
        message = f"carried over from revision {old.revision}"
        for step in plan.steps:
            if step.id not in carried:
                continue
            records.append(
                StepResult(
                    plan.id,
                    plan.revision,
                    step.id,
                    attempts.get(step.id, 1),
                    StepStatus.SUCCEEDED,
                    json.dumps(outputs[step.id]),
                    message=message,
                )
            )
            if step.compensate is not None and compensations.get(step.id) in (
                None,
                CompensationStatus.NEEDED,
                CompensationStatus.RUNNING,
            ):
                records.append(
                    CompensationRecord(plan.id, plan.revision, step.id, CompensationStatus.NEEDED)
                )
        record = RevisionRecord(
            plan.id,
            plan.revision,
            old.revision,
            rationale,
            author,
            diff_plans(old, plan),
            carried,
            self.clock(),
        )
        if self.store is not None:
            await self.store.save_revision(plan, record, records)
        state = fold(plan.id, plan.revision, plan.model_dump_json(), records)
        return Revision(plan, record), state

    # --- circuit breakers --------------------------------------------------------------------

    async def _load_breakers(self) -> None:
        if self._breakers_loaded or self.store is None:
            return
        self._breakers_loaded = True
        for state in await self.store.breakers():
            self._breakers.setdefault(state.tool, state)

    def breaker_denial(self, tool: str) -> str:
        """Why a call of ``tool`` may not start now ("" when it may)."""
        state = self._breakers.get(tool)
        settings = self.config.circuit_breaker
        if state is None or state.opened_at is None or settings is None:
            return ""
        retry_at = state.opened_at + settings.reset_after_s
        now = self.clock()
        if now >= retry_at:
            return ""  # half-open: one more call may show the tool is back
        when = datetime.fromtimestamp(retry_at, UTC).isoformat(timespec="seconds")
        return (
            f"circuit open for tool {tool!r} after {state.failures} failures; retry after "
            f"{when} (in {retry_at - now:.1f}s)"
        )

    async def breaker_result(self, tool: str, failure_class: FailureClass | None) -> None:
        """Count an attempt's outcome on ``tool``'s breaker; persist a change."""
        settings = self.config.circuit_breaker
        if settings is None:
            return
        previous = self._breakers.get(tool)
        if failure_class is None:
            if previous is None or (previous.failures == 0 and previous.opened_at is None):
                return
            state = BreakerState(tool)
            logger.info("circuit for tool %s closed", tool)
        elif failure_class in _RETRYABLE:
            failures = (0 if previous is None else previous.failures) + 1
            opened_at = None if previous is None else previous.opened_at
            if failures >= settings.failure_threshold:
                opened_at = self.clock()
                logger.warning("circuit for tool %s open after %d failures", tool, failures)
            state = BreakerState(tool, failures, opened_at)
        else:
            return
        self._breakers[tool] = state
        if self.store is not None:
            try:
                await self.store.save_breaker(state)
            except StoreError as exc:  # the breaker still works in memory
                logger.error("cannot persist the circuit breaker of tool %s: %s", tool, exc)

    def _require_store(self, plan_id: str, action: str) -> StateStore:
        if self.store is None:
            raise PlanControlError(
                plan_id,
                f"cannot {action} plan {plan_id!r}: it is not running here and the engine has "
                f"no state store",
            )
        return self.store

    async def _execute(self, run: _PlanRun[P]) -> PlanResult[P]:
        while True:
            plan_id = run.plan.id
            self._runs[plan_id] = run
            try:
                result = await run.execute()
            finally:
                if self._runs.get(plan_id) is run:
                    del self._runs[plan_id]
            if run.replacement is None:
                return result
            run = run.replacement  # a replan: continue with the new revision


def _check_stored_decision(
    state: PlanState, gate_id: str, revision: int, output: dict[str, Any] | None
) -> GateKind:
    """The kind of the gate a decision for a stored (not running) plan applies to.

    Raises:
        GateDecisionError: When the decision does not apply.
    """
    plan_id = state.plan_id
    if revision != state.revision:
        raise GateDecisionError(
            plan_id,
            gate_id,
            revision,
            f"plan {plan_id!r} is at revision {state.revision}; a decision given for revision "
            f"{revision} does not apply to it",
        )
    if state.status.is_final:
        raise GateDecisionError(
            plan_id, gate_id, revision, f"plan {plan_id!r} is already {state.status.value}"
        )
    gate = state.gates.get(gate_id)
    if gate is not None:
        if gate.decision is not GateDecision.OPEN:
            raise GateDecisionError(
                plan_id,
                gate_id,
                revision,
                f"gate {gate_id!r} of plan {plan_id!r} is already {gate.decision.value}",
            )
        kind = gate.kind
    else:
        steps = json.loads(state.plan_json).get("steps", [])
        if not any(s.get("id") == gate_id and s.get("kind") == "gate" for s in steps):
            raise GateDecisionError(
                plan_id, gate_id, revision, f"plan {plan_id!r} has no open gate {gate_id!r}"
            )
        step = state.steps.get(gate_id)
        if step is not None and step.status is not StepStatus.RUNNING:
            raise GateDecisionError(
                plan_id,
                gate_id,
                revision,
                f"gate {gate_id!r} of plan {plan_id!r} is already {step.status.value}",
            )
        kind = GateKind.GATE
    if output is not None and kind is GateKind.GATE:
        raise GateDecisionError(
            plan_id, gate_id, revision, "an output may only be given to a reconcile gate"
        )
    return kind


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
    abort: bool = False  # a budget ran out: never held at a policy gate


class _Journal:
    """Groups one run's records into one store commit per scheduler tick.

    ``add`` appends records to the open batch and returns the batch's future, which completes
    once the batch is committed. The flusher commits a batch, then the next one with everything
    added meanwhile, so the records of every transition during one loop iteration (or during one
    commit) share one transaction. A batch future never carries an exception: a waiter checks
    ``error`` after it completes.
    """

    def __init__(
        self,
        store: StateStore,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self.loop = loop
        self.on_failure = on_failure
        self.records: list[Record] = []
        self.future: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.closed = False

    def add(self, *records: Record) -> asyncio.Future[None]:
        """Queue ``records`` for the next commit; the future completes when they are committed."""
        future = self.future
        if future is None:
            future = self.future = self.loop.create_future()
        if self.closed or self.error is not None:
            return future  # never completes: the run is being torn down
        self.records.extend(records)
        if self.task is None:
            self.task = self.loop.create_task(self._flush())
        return future

    async def write(self, *records: Record) -> None:
        """Queue ``records`` and wait until they are committed.

        Raises:
            StoreError: When the store failed.
        """
        if self.error is None:
            await self.add(*records)
        if self.error is not None:
            raise self.error

    async def flush(self) -> None:
        """Wait until everything queued is committed.

        Raises:
            StoreError: When the store failed.
        """
        while self.task is not None:
            await asyncio.shield(self.task)
        if self.error is not None:
            raise self.error

    async def abort(self) -> None:
        """Drop what is not committed yet and wait for a commit in progress (an interruption)."""
        self.closed = True
        self.records = []
        task = self.task
        if task is not None:
            await asyncio.wait([task])

    async def _flush(self) -> None:
        try:
            while self.records and not self.closed:
                records, future = self.records, self.future
                self.records, self.future = [], None
                try:
                    await self.store.commit(records)
                except Exception as exc:
                    logger.error("state store commit failed: %s", exc)
                    self.error = exc if isinstance(exc, StoreError) else StoreError(str(exc))
                    self.on_failure(self.error)
                    if future is not None:
                        future.set_result(None)
                    return
                if future is not None:
                    future.set_result(None)
        finally:
            self.task = None


class _PlanRun(Generic[P]):
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
        self.idempotent: Callable[[str], bool] | None = getattr(self.tools, "is_idempotent", None)
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
        self.clock = engine.clock
        self.budget = plan.budget
        self.breakers = engine._breakers
        self.cost_of: Callable[[str], float] | None = getattr(self.tools, "cost", None)
        self.started_at: float | None = None
        self.spent_calls = 0
        self.spent_cost = 0.0
        # Steps that need not wait for their intent's commit (see _needs_durable_intent), and a
        # completed future that stands for "no wait".
        self.no_wait: asyncio.Future[None] = self.loop.create_future()
        self.no_wait.set_result(None)
        self.intent_waits: dict[str, bool] = {}

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
            now = self.clock()
            if self.started_at is None:
                self.started_at = now
            self._record(
                PlanStatusRecord(
                    plan.id,
                    plan.revision,
                    PlanStatus.RUNNING,
                    at=now,
                    trace_context=_traceparent(span) if self.tracing else "",
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
            if self.budget is not None or self.breakers:
                denial, abort, cost = self._admit(step)
                if denial:
                    self.attempts[step_id] = attempt - 1
                    self._deny(step, attempt - 1, denial, abort)
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
            task = self.loop.create_task(self._execute(step, attempt, durable))
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
        step = self.steps[step_id]
        if (
            outcome.failure_class is FailureClass.POLICY
            and not outcome.abort
            and step.on_policy_failure == "gate"
        ):
            self._policy_gate(step, outcome.attempts, outcome.message)
            return False
        self._fail(step_id, outcome.failure_class, outcome.message, outcome.attempts)
        return False

    def _needs_durable_intent(self, step: Step) -> bool:
        """Whether ``step`` must wait for its intent's commit before its side effect starts.

        An idempotent step (a cross-agent step, or a tool the runner's ``is_idempotent`` names)
        of a plan without a budget need not: its intent still precedes its result in the
        journal, and if a crash loses the intent the step looks never started (or in flight) and
        is simply run again, which idempotency makes safe. A budget's reservations must be
        durable before the calls they pay for, so a plan with a budget always waits.
        """
        if self.budget is not None:
            return True
        key = step.tool if isinstance(step, ToolStep) else ""  # "": not a tool (names are not "")
        waits = self.intent_waits.get(key)
        if waits is None:
            waits = self.intent_waits[key] = not self._is_idempotent(step)
        return waits

    # --- budgets, breakers, policy gates -----------------------------------------------------

    def _admit(self, step: Step) -> tuple[str, bool, float | None]:
        """Check the breaker and reserve the budget for one attempt of ``step``.

        Returns:
            ``("", False, cost)`` when the attempt may start (``cost``: the cost units reserved,
            ``None`` without a budget); otherwise ``(why, abort, None)`` with ``abort`` True for a
            budget that ran out.
        """
        if isinstance(step, ToolStep) and self.breakers:
            denial = self.engine.breaker_denial(step.tool)
            if denial:
                return denial, False, None
        budget = self.budget
        if budget is None:
            return "", False, None
        cost = 1.0
        if isinstance(step, ToolStep) and self.cost_of is not None:
            cost = float(self.cost_of(step.tool))
        if budget.wall_time_s is not None and self.started_at is not None:
            used = self.clock() - self.started_at
            if used >= budget.wall_time_s:
                return (
                    f"budget exhausted: wall time {used:.1f}s/{budget.wall_time_s:g}s used; "
                    f"step {step.id!r} not started",
                    True,
                    None,
                )
        if budget.tool_calls is not None and self.spent_calls + 1 > budget.tool_calls:
            return (
                f"budget exhausted: tool_calls {self.spent_calls}/{budget.tool_calls} used; "
                f"step {step.id!r} needs 1 more",
                True,
                None,
            )
        if budget.cost_units is not None and self.spent_cost + cost > budget.cost_units + 1e-9:
            return (
                f"budget exhausted: cost_units {self.spent_cost:g}/{budget.cost_units:g} used; "
                f"step {step.id!r} needs {cost:g} more",
                True,
                None,
            )
        self.spent_calls += 1
        self.spent_cost += cost
        return "", False, cost

    def _deny(self, step: Step, attempts: int, message: str, abort: bool) -> None:
        """An attempt of ``step`` may not start: a policy gate, or a policy failure."""
        if not abort and step.on_policy_failure == "gate":
            self._policy_gate(step, attempts, message)
            return
        self._fail(step.id, FailureClass.POLICY, message, attempts)
        self._stop(f"the plan stopped after step {step.id!r} failed")

    def _policy_gate(self, step: Step, attempts: int, message: str) -> None:
        """Hold the plan at a gate named after ``step``, which failed a policy check."""
        plan = self.plan
        self.attempts[step.id] = attempts
        self._record(
            StepResult(
                plan.id,
                plan.revision,
                step.id,
                attempts,
                StepStatus.BLOCKED,
                failure_class=FailureClass.POLICY,
                message=message,
            )
        )
        self.gates[step.id] = GateKind.POLICY
        self.gate_prompts[step.id] = (
            f"step {step.id!r} failed a policy check: {message}; approve to re-run it, "
            f"reject to fail it"
        )
        self._announce_gate(step.id)

    # --- revisions ---------------------------------------------------------------------------

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
            or not self.failures
            or any(f.failure_class is not FailureClass.LOGIC for f in self.failures)
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
        rationale = (
            f"step {failure.step_id!r} failed ({failure.failure_class.value}): {failure.message}"
        )
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
                spent=(self.spent_calls, self.spent_cost),
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
        if step_id:
            if status in _SETTLED:
                self.metrics.step_settled(self.agent, status.value)
            elif status is StepStatus.RETRYING:
                self.metrics.retried(
                    self.agent, failure_class.value if failure_class else "unknown"
                )
            if self.tracing:
                self._span_event(step_id, status, attempt, failure_class, delay_s)
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

    def _span_event(
        self,
        step_id: str,
        status: StepStatus | PlanStatus,
        attempt: int,
        failure_class: FailureClass | None,
        delay_s: float | None,
    ) -> None:
        """Retries, gate openings and compensations as events on the plan span."""
        if not isinstance(status, StepStatus):
            return
        if status is StepStatus.RETRYING:
            name = "retry"
        elif status is StepStatus.BLOCKED:
            name = "gate.blocked"
        elif status in _COMPENSATION_EVENT:
            name = "compensation"
        else:
            return
        span = self.span
        if not span.is_recording():  # the run has ended (e.g. a late compensation event)
            return
        attributes: dict[str, str | int | float] = {
            "stratagem.step.id": step_id,
            "stratagem.step.attempt": attempt,
        }
        if name == "gate.blocked":
            attributes["stratagem.gate.kind"] = self.gates.get(step_id, GateKind.GATE).value
        elif name == "compensation":
            attributes["stratagem.compensation.status"] = (
                "retrying"
                if failure_class is not None and status is StepStatus.COMPENSATING
                else _COMPENSATION_EVENT[status]
            )
            tool = self.steps[step_id].compensate
            if tool is not None:
                attributes["gen_ai.tool.name"] = tool
        if failure_class is not None:
            attributes[_FAILURE_CLASS_ATTR] = failure_class.value
        if delay_s is not None:
            attributes["stratagem.retry.delay_s"] = delay_s
        span.add_event(name, attributes)

    # --- gates and control -------------------------------------------------------------------

    def _reach_gate(self, step: GateStep) -> None:
        decision = self.decisions.pop(step.id, None)
        if decision is not None:
            self._decide(
                step.id,
                GateKind.GATE,
                decision.decision is GateDecision.APPROVED,
                decision.approver,
                decision.rationale,
                None,
            )
            return
        self.gates[step.id] = GateKind.GATE
        self._announce_gate(step.id)

    def _announce_gate(self, gate_id: str) -> None:
        """Mark ``gate_id`` blocked (and the plan), emit the events, record the opening."""
        plan = self.plan
        kind = self.gates[gate_id]
        step = self.steps[gate_id]
        prompt = self.gate_prompts.get(gate_id) or (
            step.prompt if isinstance(step, GateStep) else _reconcile_prompt(step)
        )
        self.statuses[gate_id] = StepStatus.BLOCKED
        if gate_id not in self.recorded_gates:  # a resumed run finds some recorded already
            self.recorded_gates.add(gate_id)
            self._record(
                GateRecord(plan.id, plan.revision, gate_id, GateDecision.OPEN, kind, prompt=prompt)
            )
        self._emit(gate_id, StepStatus.BLOCKED, self.attempts.get(gate_id, 0), message=prompt)
        logger.info("plan %s@%d: gate %s is waiting: %s", plan.id, plan.revision, gate_id, prompt)
        if not self.blocked:
            self.blocked = True
            self._record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.BLOCKED, prompt))
            self._emit("", PlanStatus.BLOCKED, 0, message=prompt)

    def check_decision(
        self, gate_id: str, revision: int, output: dict[str, Any] | None
    ) -> GateKind:
        """The kind of gate a decision applies to; raises ``GateDecisionError`` when none."""
        plan = self.plan
        if revision != plan.revision:
            raise GateDecisionError(
                plan.id,
                gate_id,
                revision,
                f"plan {plan.id!r} is at revision {plan.revision}; a decision given for "
                f"revision {revision} does not apply to it",
            )
        kind = self.gates.get(gate_id)
        if kind is None:
            step = self.steps.get(gate_id)
            if not (
                isinstance(step, GateStep)
                and self.statuses[gate_id] is StepStatus.PENDING
                and gate_id not in self.decisions
            ):
                state = "unknown" if step is None else self.statuses[gate_id].value
                raise GateDecisionError(
                    plan.id,
                    gate_id,
                    revision,
                    f"plan {plan.id!r} has no open gate {gate_id!r} (the step is {state})",
                )
            kind = GateKind.GATE
        if output is not None and kind is GateKind.GATE:
            raise GateDecisionError(
                plan.id, gate_id, revision, "an output may only be given to a reconcile gate"
            )
        return kind

    def apply_decision(
        self,
        gate_id: str,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
    ) -> None:
        """Act on a recorded decision (``Engine.decide``)."""
        kind = self.gates.pop(gate_id, None)
        if kind is None:
            if isinstance(self.steps.get(gate_id), GateStep) and (
                self.statuses[gate_id] is StepStatus.PENDING
            ):  # decided before the gate was reached
                decision = GateDecision.APPROVED if approve else GateDecision.REJECTED
                self.decisions[gate_id] = GateState(
                    gate_id,
                    GateKind.GATE,
                    decision,
                    self.plan.revision,
                    approver=approver,
                    rationale=rationale,
                )
            else:
                logger.info("plan %s: gate %s closed before its decision", self.plan.id, gate_id)
            return
        try:
            self._decide(gate_id, kind, approve, approver, rationale, output)
            # The decision comes from the caller's task; the steps it releases belong under the
            # plan span, like those a completion starts.
            self.callback_context.run(self._start_ready)
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            if not self.finished.done():
                self.finished.set_exception(exc)
            return
        self._maybe_finish()

    def _decide(
        self,
        gate_id: str,
        kind: GateKind,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
    ) -> None:
        logger.info(
            "plan %s gate %s %s by %s: %s",
            self.plan.id,
            gate_id,
            "approved" if approve else "rejected",
            approver,
            rationale,
        )
        attempt = self.attempts.get(gate_id, 0)
        if self.tracing and self.span.is_recording():
            self.span.add_event(
                "gate.decided",
                {
                    "stratagem.step.id": gate_id,
                    "stratagem.gate.kind": kind.value,
                    "stratagem.gate.decision": "approved" if approve else "rejected",
                    "stratagem.gate.approver": approver,
                },
            )
        if not approve:
            message = f"rejected by {approver}: {rationale}"
            self._fail(gate_id, FailureClass.POLICY, message, attempt)
            self._stop(f"the plan stopped after gate {gate_id!r} was rejected")
        elif kind is GateKind.GATE:
            gate_output = {"approved": True, "approver": approver, "rationale": rationale}
            self._succeed(gate_id, gate_output, attempt, json.dumps(gate_output))
            self._release(gate_id)
        elif output is not None:
            self._succeed(gate_id, output, attempt, json.dumps(output))
            self._release(gate_id)
        else:  # re-run the reconciled step
            self.statuses[gate_id] = StepStatus.PENDING
            self.next_attempt[gate_id] = attempt + 1
            self.ready.appendleft(gate_id)
        if not self.gates and self.blocked:
            self.blocked = False
            if not self.stop_reason:
                plan = self.plan
                self._record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.RUNNING))
                self._emit("", PlanStatus.RUNNING, 0)

    def _close_gates(self) -> None:
        """The plan stops with gates open: they end ``cancelled``."""
        for gate_id in list(self.gates):
            del self.gates[gate_id]
            self.statuses[gate_id] = StepStatus.CANCELLED
            message = self.stop_reason or "the plan ended"
            plan = self.plan
            self._record(
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
            self._emit(gate_id, StepStatus.CANCELLED, 0, FailureClass.CANCELLED, message)

    def pause(self) -> None:
        """Start no new step; the run ends ``paused`` once the running steps finish."""
        if self.paused or self.stop_reason:
            return
        self.paused = True
        logger.info("plan %s@%d: pausing", self.plan.id, self.plan.revision)
        self._maybe_finish()

    def cancel(self) -> None:
        """Cancel the running steps, compensate, end ``cancelled``."""
        if self.cancelled:
            return
        self.cancelled = True
        self.paused = False
        logger.info("plan %s@%d: cancelling", self.plan.id, self.plan.revision)
        self.stop_reason = ""
        self._stop("the plan was cancelled")
        self._maybe_finish()

    # --- resume ------------------------------------------------------------------------------

    def restore(self, state: PlanState) -> None:
        """Take the recorded state: what is done stays done, what was in flight is reconciled."""
        plan = self.plan
        self.restored = True
        self.links = _resume_links(state.trace_contexts)
        self.started_at = state.started_at
        self.spent_calls = state.spent_calls
        self.spent_cost = state.spent_cost
        stopping = state.cancel_requested or any(
            s.status is StepStatus.FAILED for s in state.steps.values()
        )
        self.recorded_gates = {
            g.gate_id for g in state.gates.values() if g.decision is GateDecision.OPEN
        }
        if state.cancel_requested:
            self.cancelled = True
            self.stop_reason = "the plan was cancelled"
        for step in plan.steps:
            recorded = state.steps.get(step.id)
            if recorded is None:
                continue
            step_id = step.id
            self.attempts[step_id] = recorded.attempt
            match recorded.status:
                case StepStatus.SUCCEEDED:
                    self.outputs[step_id] = recorded.output
                    self.statuses[step_id] = StepStatus.SUCCEEDED
                    for dependent in self.dependents[step_id]:  # ready is computed below
                        self.waiting[dependent] -= 1
                case StepStatus.FAILED:
                    self.statuses[step_id] = StepStatus.FAILED
                    self.failures.append(
                        StepFailure(
                            step_id,
                            recorded.failure_class or FailureClass.LOGIC,
                            recorded.message,
                            recorded.attempt,
                        )
                    )
                    if not self.stop_reason:
                        self.stop_reason = f"the plan stopped after step {step_id!r} failed"
                case StepStatus.CANCELLED:
                    self.statuses[step_id] = StepStatus.CANCELLED
                case StepStatus.RETRYING:  # its last attempt failed and was to be retried
                    self.next_attempt[step_id] = recorded.attempt + 1
                case StepStatus.BLOCKED:  # held at a policy gate
                    self._restore_policy_gate(step, recorded.attempt, recorded.message, state)
                case StepStatus.RUNNING:
                    self._restore_in_flight(step, recorded.attempt, state, stopping)
                case _:
                    pass
        for gate in state.gates.values():
            if (
                gate.kind is GateKind.GATE
                and gate.decision is not GateDecision.OPEN
                and self.statuses.get(gate.gate_id) is StepStatus.PENDING
            ):
                self.decisions[gate.gate_id] = gate
        for entry in state.compensations:
            if self.statuses.get(entry.step_id) is not StepStatus.SUCCEEDED:
                continue
            self.compensable.append(entry.step_id)
            self.compensation[entry.step_id] = entry.status
            self.compensation_attempts[entry.step_id] = entry.attempt
            if entry.status is CompensationStatus.COMPENSATED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATED
            elif entry.status is CompensationStatus.FAILED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATION_FAILED
        self.ready.extend(
            step.id
            for step in plan.steps
            if self.statuses[step.id] is StepStatus.PENDING and self.waiting[step.id] == 0
        )

    def _restore_policy_gate(
        self, step: Step, attempt: int, message: str, state: PlanState
    ) -> None:
        gate = state.gates.get(step.id)
        if gate is not None and gate.decision is not GateDecision.OPEN:
            approve = gate.decision is GateDecision.APPROVED
            self._decide(
                step.id, GateKind.POLICY, approve, gate.approver, gate.rationale, gate.output
            )
            return
        self.gates[step.id] = GateKind.POLICY
        self.statuses[step.id] = StepStatus.BLOCKED
        self.gate_prompts[step.id] = gate.prompt if gate is not None else message
        self.new_gates.append(step.id)

    def _restore_in_flight(
        self, step: Step, attempt: int, state: PlanState, stopping: bool
    ) -> None:
        """A step was in flight when the plan stopped: re-run, reconcile, or mark it cancelled."""
        plan, step_id = self.plan, step.id
        if stopping:
            # The plan is ending anyway: the step is not re-run; its effect, if any, is not
            # compensated (only recorded successes are).
            self.statuses[step_id] = StepStatus.CANCELLED
            self._record(
                StepResult(
                    plan.id,
                    plan.revision,
                    step_id,
                    attempt,
                    StepStatus.CANCELLED,
                    failure_class=FailureClass.CANCELLED,
                    message="in flight when the plan stopped; not re-run as the plan is ending",
                )
            )
            return
        if self._is_idempotent(step):
            logger.info("plan %s: re-running idempotent in-flight step %s", plan.id, step_id)
            self.next_attempt[step_id] = attempt + 1
            return
        gate = state.gates.get(step_id)
        if gate is None or gate.decision is GateDecision.OPEN:
            self.gates[step_id] = GateKind.RECONCILE
            self.statuses[step_id] = StepStatus.BLOCKED
            self.new_gates.append(step_id)
            return
        approve = gate.decision is GateDecision.APPROVED
        self._decide(
            step_id, GateKind.RECONCILE, approve, gate.approver, gate.rationale, gate.output
        )

    def _is_idempotent(self, step: Step) -> bool:
        match step:
            case CrossAgentStep():
                return True  # the target answers a repeated request id from its store
            case ToolStep():
                return self.idempotent is not None and bool(self.idempotent(step.tool))
            case GateStep():
                return True
            case _:
                assert_never(step)

    def recorded_result(self, state: PlanState) -> PlanResult[P]:
        """The result of a finished plan, from its journal (nothing runs)."""
        for step_id, recorded in state.steps.items():
            if step_id not in self.statuses:
                continue
            self.statuses[step_id] = recorded.status
            if recorded.status is StepStatus.SUCCEEDED:
                self.outputs[step_id] = recorded.output
            elif recorded.status is StepStatus.FAILED:
                self.failures.append(
                    StepFailure(
                        step_id,
                        recorded.failure_class or FailureClass.LOGIC,
                        recorded.message,
                        recorded.attempt,
                    )
                )
        for entry in state.compensations:
            if entry.status is CompensationStatus.COMPENSATED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATED
            elif entry.status is CompensationStatus.FAILED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATION_FAILED
        for step_id, status in self.statuses.items():
            if status is StepStatus.PENDING:
                self.statuses[step_id] = StepStatus.SKIPPED
        self._emit("", state.status, 0, message=state.message)
        return self._result(state.status, 0.0)

    # --- compensation ------------------------------------------------------------------------

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
            if failure_class in _RETRYABLE and attempt - first + 1 < step.retry.max_attempts:
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

    # --- one step ----------------------------------------------------------------------------

    async def _execute(
        self, step: Step, attempt: int, durable: asyncio.Future[None] | None
    ) -> _Outcome:
        """Attempt ``step`` until it succeeds, fails for good or is cancelled.

        ``durable`` completes when the first attempt's intent is committed (with a store).
        """
        timeout = step.timeout_s or self.default_timeout
        rng: random.Random | None = None
        run_attempt = self._attempt if self.tracing else self._attempt_body
        journal, plan = self.journal, self.plan
        while True:
            if journal is not None:  # the intent is durable before the side effect starts
                # (for an idempotent step, ``durable`` is ``no_wait``: see _needs_durable_intent)
                if durable is None:
                    durable = journal.add(StepIntent(plan.id, plan.revision, step.id, attempt))
                await durable
                durable = None
                if journal.error is not None:
                    raise journal.error
            output, failure_class, message = await run_attempt(step, attempt, timeout)
            if isinstance(step, ToolStep) and (failure_class is not None or self.breakers):
                await self.engine.breaker_result(step.tool, failure_class)
            if failure_class is None:
                return _Outcome(output, None, "", attempt)
            if failure_class not in _RETRYABLE or attempt >= step.retry.max_attempts:
                return _Outcome(None, failure_class, message, attempt)
            if rng is None:
                rng = random.Random(f"{self.seed}:{step_run_id(plan.id, plan.revision, step.id)}")
            delay = backoff_delay(step.retry, attempt, rng)
            self.statuses[step.id] = StepStatus.RETRYING
            self._record(
                StepResult(
                    plan.id,
                    plan.revision,
                    step.id,
                    attempt,
                    StepStatus.RETRYING,
                    failure_class=failure_class,
                    message=message,
                )
            )
            self._emit(
                step.id,
                StepStatus.RETRYING,
                attempt,
                failure_class,
                f"{message}; retrying in {delay:.3f}s",
                delay,
            )
            await self.sleep(delay)
            cost = None
            if self.budget is not None or self.breakers:
                denial, abort, cost = self._admit(step)
                if denial:
                    return _Outcome(None, FailureClass.POLICY, denial, attempt, abort)
            attempt += 1
            self.attempts[step.id] = attempt
            self.statuses[step.id] = StepStatus.RUNNING
            self._emit(step.id, StepStatus.RUNNING, attempt)
            if journal is not None:
                durable = journal.add(StepIntent(plan.id, plan.revision, step.id, attempt, cost))
                if not self._needs_durable_intent(step):
                    durable = self.no_wait

    async def _attempt(
        self, step: Step, attempt: int, limit_s: float
    ) -> tuple[dict[str, Any] | None, FailureClass | None, str]:
        """One attempt, in its own span: (output, None, "") or (None, class, message)."""
        # start_span and attach/detach rather than start_as_current_span: the same span made
        # current the same way, without two generator context managers per span.
        span = self.tracer.start_span(
            f"step {step.id}",
            attributes={
                "stratagem.plan.id": self.plan.id,
                "stratagem.step.id": step.id,
                "stratagem.step.kind": step.kind,
                "stratagem.step.attempt": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            output, failure_class, message = await self._attempt_body(step, attempt, limit_s)
            if failure_class is not None:
                _fail_span(span, failure_class, message)
            return output, failure_class, message
        except asyncio.CancelledError:
            _fail_span(span, FailureClass.CANCELLED, "cancelled")
            raise
        finally:
            otel_context.detach(token)
            span.end()

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
                case GateStep():  # gates are decided, never run; the scheduler keeps them apart
                    raise LogicError(f"gate {step.id!r} cannot be run as a task")
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
            span = self.tracer.start_span(
                f"execute_tool {step.tool}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": step.tool,
                    "gen_ai.tool.call.id": ctx.call_id,
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                output = await self._limited(
                    self.tools.run_tool(step.tool, tool_input, ctx), limit_s
                )
            except Exception as exc:  # what start_as_current_span records (not cancellations)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                otel_context.detach(token)
                span.end()
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


def _traceparent(span: Span) -> str:
    """The W3C ``traceparent`` of ``span``."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The span context a ``traceparent`` names, or ``None`` when it is malformed."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return context if context.is_valid else None


def _resume_links(trace_contexts: list[str]) -> list[Link]:
    """Links from a resumed run's plan span to the original run and to the run it continues."""
    links: list[Link] = []
    if not trace_contexts:
        return links
    first, last = trace_contexts[0], trace_contexts[-1]
    for traceparent, kind in ((first, "original"), (last, "previous")):
        context = _span_context(traceparent)
        if context is None or (kind == "previous" and last == first):
            continue
        links.append(Link(context, {"stratagem.link.kind": kind}))
    return links


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


def _reconcile_prompt(step: Step) -> str:
    match step:
        case ToolStep():
            what = f"step {step.id!r} (tool {step.tool!r})"
        case CrossAgentStep():
            what = f"step {step.id!r} ({step.target}.{step.capability})"
        case GateStep():
            what = f"gate {step.id!r}"
        case _:
            assert_never(step)
    return f"{what} was in flight when the plan stopped; approve to re-run it, reject to fail it"


def _summary(failures: list[StepFailure]) -> str:
    if not failures:
        return ""
    first = failures[0]
    text = f"step {first.step_id!r} failed ({first.failure_class.value}): {first.message}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    return text
