"""``Engine``: runs plans for one agent and reaches its active runs (decide, pause, cancel)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from stratagem.planning._artifacts._claim import ClaimCheck, restore_claimed
from stratagem.planning._dag import structural_problems
from stratagem.planning._dispatch import Dispatcher
from stratagem.planning._engine._deps import ChildResult, RunDeps
from stratagem.planning._engine._fork import make_fork
from stratagem.planning._engine._gate_model import check_decision_input
from stratagem.planning._engine._policy import FailurePolicy, _Breakers
from stratagem.planning._engine._revise import make_revision
from stratagem.planning._engine._run import _PlanRun
from stratagem.planning._engine._types import (
    EngineConfig,
    GateNotifier,
    PlanResult,
    StepEvent,
    ToolApproval,
    ToolRunner,
)
from stratagem.planning._errors import (
    GateDeciderError,
    GateDecisionError,
    PlanControlError,
    PlanValidationError,
)
from stratagem.planning._kinds import is_decided
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import Plan, PlanStatus, StepStatus
from stratagem.planning._revisions import Replanner, Revision
from stratagem.planning._store import (
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    PlanState,
    PlanStatusRecord,
    Record,
    StateStore,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)

_TRACER_NAME: Final = "stratagem.planning"

_NOT_GIVEN: Any = object()
"""``Engine.decide``'s ``value`` when none is given (``None`` may be a value)."""


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
        notifier: Told when a gate opens, escalates or times out (``GateNotifier``).
        claim_check: Where a tool step's output larger than its ``max_inline_bytes`` goes, as an
            artifact, the journal keeping the reference (``planning.ClaimCheck``; ``None``: every
            output inline). A resumed plan loads such outputs back before any step runs.
        approvals: The policy's tool approvals (``ToolApproval``): a tool step of such a tool
            waits at a tool gate until approved. ``approvals`` may be set again later; a run
            takes the rules of when it starts.
        nested_events: For the nested plans of sub-plan and loop steps (each a plan of its own):
            given such a plan when it starts, the callback for its events (``None``: none). The
            parent's ``on_event`` gets only the parent's events.
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
        notifier: GateNotifier | None = None,
        approvals: Sequence[ToolApproval] = (),
        nested_events: Callable[[Plan], Callable[[StepEvent], None] | None] | None = None,
        claim_check: ClaimCheck | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        self.claim_check = claim_check
        self.agent = agent
        self.agent_id = agent_id or agent
        self.store = store
        self.replanner = replanner
        self.clock = clock
        self.notifier = notifier
        self.approvals: tuple[ToolApproval, ...] = tuple(approvals)
        self._tools = tools
        self._dispatcher = dispatcher
        self._sleep = sleep
        self._tracer = trace.get_tracer(_TRACER_NAME, tracer_provider=tracer_provider)
        self._metrics = PlanningMetrics(meter_provider)
        self._runs: dict[str, _PlanRun[Any]] = {}
        self._policy = FailurePolicy()
        self._breakers = _Breakers(self.config.circuit_breaker, self._policy, store, clock)
        self.nested_events = nested_events
        self._children = _Children(self)

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
        run = _PlanRun(self._deps(), plan, on_event)
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
        await self._breakers.load()
        return await self._follow(run)

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
        if self.claim_check is not None:  # outputs journaled by reference, loaded back
            await restore_claimed(self.claim_check, state.steps)
        run: _PlanRun[Plan] = _PlanRun(self._deps(), state.plan(plan_type), on_event)
        if not run.is_dag():
            raise PlanValidationError(structural_problems(run.plan.steps))
        if state.status.is_final:
            return run.recorded_result(state)
        logger.info("plan %s@%d: resuming from %s", plan_id, state.revision, state.status.value)
        run.restore(state)
        run.runner.resumed = True  # its failures never open a breaker (``_Breakers.record``)
        await self._breakers.load()
        return await self._follow(run)

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
        value: Any = _NOT_GIVEN,
        arguments: Mapping[str, Any] | None = None,
        may_decide: Callable[[Sequence[str]], bool] | None = None,
    ) -> None:
        """Approve or reject a gate; the decision is recorded before it is acted on.

        For a gate step, approval lets its dependents run and rejection fails it (class
        ``policy``) and so the plan; the approval of a gate that asks (``input_schema``,
        ``choices``) carries ``value``, which must fit it. For a reconcile gate (named after a
        step that was in flight when the plan stopped), approval re-runs the step, or, with
        ``output``, records the step as succeeded with that output without running it (the
        operator found its effect done); rejection fails the step. For a tool gate (the policy
        asks for an approval of the step's tool), approval runs the step, or, with
        ``arguments``, runs it with those arguments instead, in the plan's next revision
        (authored by ``approver``); rejection fails it.

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
            value: For an approval of a gate that asks: the value (omit it otherwise).
            arguments: For an approval of a tool gate: the tool's arguments as edited (checked
                with the tool runner's ``input_problems``).
            may_decide: Told who may decide the gate (its deciders, as they are now: empty
                for anyone the policy allows), says whether ``approver`` may; ``None``: anyone.

        Raises:
            GateDecisionError: When the gate is unknown, already decided or not open, the revision
                is not the plan's, or ``output`` is given for a gate step;
                ``GateDeciderError`` when ``may_decide`` says no; ``GateValueError`` when the
                value or the arguments do not fit.
            PlanControlError: When the plan is neither running here nor in the store.
            StoreError: When the store fails.
        """
        output_json = None if output is None else json.dumps(output)
        has_value = value is not _NOT_GIVEN
        if not has_value:
            value = None
        edited = None if arguments is None else dict(arguments)
        given: dict[str, Any] = {
            "approve": approve,
            "approver": approver,
            "value": value,
            "has_value": has_value,
            "arguments": edited,
            "may_decide": may_decide,
        }

        def record(kind: GateKind) -> GateRecord:
            decision = GateDecision.APPROVED if approve else GateDecision.REJECTED
            record = GateRecord(plan_id, revision, gate_id, decision, kind, approver=approver)
            return _with_decision(record, rationale, output_json, value, has_value, edited)

        run = self._runs.get(plan_id)
        if run is not None:
            kind = run.check_decision(gate_id, revision, output, **given)
            try:
                await run.state.write(record(kind))
            except BaseException:
                run.release_decision(gate_id)
                raise
            run.apply_decision(
                gate_id, approve, approver, rationale, output, value, has_value, edited
            )
            return
        store = self._require_store(plan_id, "decide a gate of")
        state = await store.load(plan_id)
        if state is None:
            raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
        kind = _check_stored_decision(state, gate_id, revision, output, self._tools, **given)
        await store.commit([record(kind)])
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
            await run.state.write(ControlRecord(plan_id, run.plan.revision))
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
        revision, _ = await make_revision(
            old,
            new_plan,
            state.outputs,
            attempts,
            compensations,
            rationale,
            author,
            spent=(state.spent_calls, state.spent_cost),
            items={
                key: entry.output
                for key, entry in state.steps.items()
                if "." in key and entry.status is StepStatus.SUCCEEDED
            },
            maps=state.maps,
            store=self.store,
            clock=self.clock,
        )
        logger.info(
            "plan %s: revision %d made by %s: %s", plan_id, revision.revision, author, rationale
        )
        return revision

    async def fork(
        self,
        plan_id: str,
        new_plan_id: str,
        *,
        at_step: str | None = None,
        revision: int | None = None,
        outputs: Mapping[str, Any] | None = None,
        author: str,
        plan_type: type[Plan] = Plan,
    ) -> Plan:
        """Make a new plan from a stored one: the steps before the fork point carry their
        recorded results (``outputs`` replaces some), the rest runs when ``resume`` runs it.

        The fork point is ``at_step`` of ``revision`` (the newest by default): the steps whose
        success was recorded before ``at_step`` first started are before it; without
        ``at_step``, every step that succeeded in the revision is. A step given an output in
        ``outputs`` must be before it; the steps depending on it run again. The new plan
        records where it comes from (``Plan.forked_from``) and its first revision's history
        entry names it; its steps after the fork point get their own idempotency keys (its id),
        so each of their effects happens once more, in the fork, and the carried ones not again.
        The original is never changed. ``docs/durability.md`` says what this covers.

        Args:
            plan_id: The plan forked (any status; a running one forks as far as it got).
            new_plan_id: The new plan's id (not in the store yet).
            at_step: The fork point's step (``None``: the end of the revision).
            revision: The revision forked (``None``: the newest).
            outputs: Step id -> an output (a JSON object) substituted for the recorded one.
            author: Who forks it (the new plan's first revision's author).
            plan_type: The class to read the stored plan as.

        Returns:
            The new plan, stored and not yet run.

        Raises:
            ForkError: No such revision or step, or an output for a step not before the fork
                point, or one that does not fit the step's output model (the tool's output
                model, a capability's response) (nothing is stored then).
            PlanControlError: No store, an unknown plan, or ``new_plan_id`` taken.
            StoreError: When the store fails.
        """
        store = self._require_store(plan_id, "fork")
        return await make_fork(
            store,
            plan_id,
            new_plan_id,
            at_step=at_step,
            revision=revision,
            outputs=outputs or {},
            author=author,
            plan_type=plan_type,
            clock=self.clock,
            tools=self._tools,
        )

    def _deps(self, nested: bool = False) -> RunDeps:
        """What a new run is given: the engine's services and settings as they are now (a
        nested plan is not replanned: its parent's step fails instead)."""
        return RunDeps(
            claim_check=self.claim_check,
            notifier=self.notifier,
            approvals=self.approvals,
            config=self.config,
            tools=self._tools,
            dispatcher=self._dispatcher,
            agent=self.agent,
            agent_id=self.agent_id,
            tracer=self._tracer,
            metrics=self._metrics,
            sleep=self._sleep,
            clock=self.clock,
            store=self.store,
            replanner=None if nested else self.replanner,
            policy=self._policy,
            breakers=self._breakers,
            children=self._children,
        )

    def _require_store(self, plan_id: str, action: str) -> StateStore:
        if self.store is None:
            raise PlanControlError(
                plan_id,
                f"cannot {action} plan {plan_id!r}: it is not running here and the engine has "
                f"no state store",
            )
        return self.store

    async def _follow(self, run: _PlanRun[P]) -> PlanResult[P]:
        """Execute ``run`` registered by plan id, then each revision a replan makes of it."""
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


class _Children:
    """Runs the nested plans of an engine's runs (``RunDeps.children``): with the engine itself,
    so a nested plan is stored, journaled, controlled and resumed like any plan of the agent."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _events(self, plan: Plan) -> Callable[[StepEvent], None] | None:
        hook = self.engine.nested_events
        return None if hook is None else hook(plan)

    async def run(self, plan: Plan, started: Callable[[object], None] | None = None) -> ChildResult:
        """See ``Children.run``."""
        engine = self.engine
        store = engine.store
        if store is not None:
            state = await store.load(plan.id)
            if state is None:
                if not await store.save_plan(plan):
                    raise PlanControlError(plan.id, f"plan {plan.id!r} could not be stored")
            else:
                stored = state.plan(Plan)
                run = _PlanRun(engine._deps(nested=True), stored, self._events(stored))
                if not run.is_dag():
                    raise PlanValidationError(structural_problems(stored.steps))
                if state.status.is_final:
                    result = run.recorded_result(state)
                    return ChildResult(
                        result.status,
                        dict(result.outputs),
                        list(result.failures),
                        state.spent_calls,
                        state.spent_cost,
                    )
                run.restore(state)
                return self._result(run, await self._follow(run))
        run = _PlanRun(engine._deps(nested=True), plan, self._events(plan))
        if not run.is_dag():
            raise PlanValidationError(structural_problems(plan.steps))
        if store is None and started is not None:
            started(run)
        return self._result(run, await self._follow(run))

    async def _follow(self, run: _PlanRun[Plan]) -> PlanResult[Plan]:
        engine = self.engine
        if run.plan.id in engine._runs:
            raise PlanControlError(run.plan.id, f"plan {run.plan.id!r} is already running")
        await engine._breakers.load()
        return await engine._follow(run)

    def _result(self, run: _PlanRun[Plan], result: PlanResult[Plan]) -> ChildResult:
        return ChildResult(
            result.status,
            dict(result.outputs),
            list(result.failures),
            run.admission.spent_calls,
            run.admission.spent_cost,
        )

    async def outputs(self, plan_id: str) -> dict[str, Any] | None:
        """See ``Children.outputs``."""
        store = self.engine.store
        if store is None:
            return None
        state = await store.load(plan_id)
        return None if state is None else state.outputs

    async def compensate(self, plan_id: str, handle: object | None, status: PlanStatus) -> str:
        """See ``Children.compensate``."""
        engine = self.engine
        store = engine.store
        if store is None:
            return await handle.undo(status) if isinstance(handle, _PlanRun) else ""
        state = await store.load(plan_id)
        if state is None or state.status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
            return ""  # it never started, or compensated itself when it ended
        records: list[Record] = []
        if not state.cancel_requested:
            records.append(ControlRecord(plan_id, state.revision))
        if state.status is PlanStatus.SUCCEEDED:  # reopened to undo what it did
            records.append(
                PlanStatusRecord(
                    plan_id,
                    state.revision,
                    PlanStatus.COMPENSATING,
                    f"its parent plan {status.value}: undoing it",
                )
            )
        if records:
            await store.commit(records)
        stored = state.plan(Plan)
        run = _PlanRun(engine._deps(nested=True), stored, self._events(stored))
        if not run.is_dag():
            raise PlanValidationError(structural_problems(stored.steps))
        run.restore(await store.load(plan_id) or state)
        result = await self._follow(run)
        failed = [k for k, v in result.statuses.items() if v is StepStatus.COMPENSATION_FAILED]
        if failed:
            return f"the compensation of {', '.join(failed)} in {plan_id!r} failed"
        return ""


def _with_decision(
    record: GateRecord,
    rationale: str,
    output_json: str | None,
    value: Any,
    has_value: bool,
    edited: dict[str, Any] | None,
) -> GateRecord:
    """``record`` with what the decision says besides who gave it: why, and what it carries."""
    return dataclasses.replace(
        record,
        rationale=rationale,
        output_json=output_json,
        value_json=json.dumps(value) if has_value else None,
        arguments_json=None if edited is None else json.dumps(edited),
    )


def _check_stored_decision(
    state: PlanState,
    gate_id: str,
    revision: int,
    output: dict[str, Any] | None,
    tools: ToolRunner,
    *,
    approve: bool,
    approver: str,
    value: Any,
    has_value: bool,
    arguments: dict[str, Any] | None,
    may_decide: Callable[[Sequence[str]], bool] | None,
) -> GateKind:
    """The kind of the gate a decision for a stored (not running) plan applies to.

    Raises:
        GateDecisionError: When the decision does not apply (see ``Engine.decide``).
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
    plan = state.plan(Plan)
    step = next((s for s in plan.steps if s.id == gate_id), None)
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
        deciders: Sequence[str] = gate.deciders
    else:
        if step is None or not is_decided(step):
            raise GateDecisionError(
                plan_id, gate_id, revision, f"plan {plan_id!r} has no open gate {gate_id!r}"
            )
        recorded = state.steps.get(gate_id)
        if recorded is not None and recorded.status is not StepStatus.RUNNING:
            raise GateDecisionError(
                plan_id,
                gate_id,
                revision,
                f"gate {gate_id!r} of plan {plan_id!r} is already {recorded.status.value}",
            )
        kind = GateKind.GATE
        deciders = step.deciders
    if may_decide is not None and not may_decide(deciders):
        raise GateDeciderError(plan_id, gate_id, revision, approver, deciders)
    if step is None:
        raise GateDecisionError(
            plan_id, gate_id, revision, f"plan {plan_id!r} has no step {gate_id!r}"
        )
    check_decision_input(
        plan_id,
        revision,
        step,
        kind,
        approve=approve,
        output=output,
        value=value,
        has_value=has_value,
        arguments=arguments,
        tools=tools,
    )
    return kind
