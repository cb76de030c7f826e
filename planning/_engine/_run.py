"""One run of one plan (revision): its parts, composed around its state, and its course.

``_PlanRun`` builds the parts of a run, each with the run's state and only the services it uses
(from the engine's ``RunDeps``), and runs them: the plan span, the scheduler, the end of the run
(gates closed, pending steps skipped, compensation, the final status) and replanning. It is also
what ``Engine`` reaches a running plan through (decisions, pause, cancel).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from opentelemetry.trace import Link, Status, StatusCode

from stratagem.planning._engine._attempts import _Attempts, _StepRunner
from stratagem.planning._engine._compensation import _Compensation
from stratagem.planning._engine._conditions import _Conditions
from stratagem.planning._engine._deps import RunDeps
from stratagem.planning._engine._gates import _Gates
from stratagem.planning._engine._journal import _Journal
from stratagem.planning._engine._map import _Maps, item_outputs_problem, list_digest
from stratagem.planning._engine._nested import _Nested
from stratagem.planning._engine._observe import _Observer, _resume_links, _traceparent
from stratagem.planning._engine._policy import _Admission
from stratagem.planning._engine._restore import _Restore
from stratagem.planning._engine._revise import make_revision
from stratagem.planning._engine._schedule import _Scheduler
from stratagem.planning._engine._state import _RunState, expansion_key
from stratagem.planning._engine._types import PlanResult, StepEvent
from stratagem.planning._errors import (
    GateDecisionError,
    PlanValidationError,
    StepFailure,
    StoreError,
)
from stratagem.planning._plan import Plan, PlanStatus, ToolStep
from stratagem.planning._revisions import replan_rationale, replanned_classes
from stratagem.planning._store import (
    CompensationStatus,
    GateDecision,
    GateKind,
    GateRecord,
    MapRecord,
    PlanState,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _PlanRun(Generic[P]):
    """One run of one plan: the parts around its state, and the run's course.

    The parts, and what each is given (see ``docs/internals.md``):

    - ``state`` (``_RunState``): the plan, the observer and the store's journal; the only writer
      of the run's state;
    - ``observer`` (``_Observer``): the plan, ``on_event`` and the metrics;
    - ``admission`` (``_Admission``): the budget, the breakers, the tools' costs, the clock;
    - ``gates`` (``_Gates``): the state, the observer, the tools (edited arguments), the clock
      (deadlines), the notifier, the tool approvals and the scheduler's ``wake``;
    - ``conditions`` (``_Conditions``): the state (conditions, routes on failure, skips);
    - ``attempts`` (``_Attempts``): the state, the observer, tools, dispatcher, tracer, sleep,
      failure policy; ``runner`` (``_StepRunner``) adds admission, breakers, seed and time limit;
    - ``maps`` (``_Maps``): the state, the attempt loop and the step runner (map items);
    - ``nested`` (``_Nested``): the state, the engine's ``Children``, admission and the clock
      (loops and sub-plans);
    - ``compensation`` (``_Compensation``): the state, the attempt loop and the nested plans;
    - ``scheduler`` (``_Scheduler``): the state, the gates, the conditions, the step runner, the
      maps, the nested plans, admission, breakers, failure policy and the in-flight bound;
    - ``restorer`` (``_Restore``): the state, the gates, the conditions, the maps, admission and
      the tools.
    """

    def __init__(
        self, deps: RunDeps, plan: P, on_event: Callable[[StepEvent], None] | None
    ) -> None:
        config = deps.config
        self.deps = deps
        self.on_event = on_event
        self.observer = _Observer(plan, on_event, deps.metrics, deps.agent)
        self.state: _RunState[P] = _RunState(plan, self.observer, deps.store)
        self.admission = _Admission(plan.budget, deps.breakers, deps.tools, deps.clock)
        self.gates = _Gates(
            self.state,
            self.observer,
            tools=deps.tools,
            clock=deps.clock,
            notifier=deps.notifier,
            approvals=deps.approvals,
            deadlines=config.gate_deadlines,
            agent=deps.agent,
            wake=lambda: self.scheduler.wake(),
        )
        self.conditions = _Conditions(self.state)
        self.attempts = _Attempts(
            self.state,
            self.observer,
            tools=deps.tools,
            dispatcher=deps.dispatcher,
            tracer=deps.tracer,
            sleep=deps.sleep,
            policy=deps.policy,
            agent=deps.agent,
            claim_check=deps.claim_check,
        )
        self.runner = _StepRunner(
            self.state,
            self.attempts,
            self.admission,
            deps.breakers,
            seed=config.seed,
            default_timeout=config.default_timeout_s,
        )
        self.maps = _Maps(self.state, self.attempts, self.runner)
        self.nested = _Nested(
            self.state, deps.children, self.admission, deps.clock, deps.policy, deps.sleep
        )
        self.compensation = _Compensation(
            self.state,
            self.attempts,
            self.nested,
            seed=config.seed,
            default_timeout=config.default_timeout_s,
        )
        self.scheduler = _Scheduler(
            self.state,
            self.gates,
            self.conditions,
            self.runner,
            self.maps,
            self.nested,
            self.admission,
            deps.breakers,
            deps.policy,
            plan.max_in_flight or config.max_in_flight,
        )
        self.restorer = _Restore(
            self.state, self.gates, self.conditions, self.maps, self.admission, deps.tools
        )
        self.restored = False
        self.links: list[Link] = []  # a resumed run's links to the runs it continues
        self.replans = 0
        self.replacement: _PlanRun[P] | None = None  # the next revision's run, after a replan
        self.ended: PlanStatus | None = None  # how execute() ended (None: interrupted)

    @property
    def plan(self) -> P:
        """The plan (revision) this run runs."""
        return self.state.plan

    @property
    def journal(self) -> _Journal | None:
        """The run's journal (``None`` without a store)."""
        return self.state.journal

    def is_dag(self) -> bool:
        """Whether the steps form a DAG (``structural_problems`` explains a no)."""
        return self.state.is_dag()

    def restore(self, recorded: PlanState) -> None:
        """Take a stored plan's state (a resume, or a new revision's carried results)."""
        self.restored = True
        self.links = _resume_links(recorded.trace_contexts)
        self.restorer.restore(recorded)

    def recorded_result(self, recorded: PlanState) -> PlanResult[P]:
        """The result of a finished plan, from its journal (nothing runs)."""
        return self.restorer.recorded_result(recorded)

    def check_decision(
        self,
        gate_id: str,
        revision: int,
        output: dict[str, Any] | None,
        **given: Any,
    ) -> GateKind:
        """The kind of gate a decision applies to (``_Gates.check_decision``: ``given`` is
        what the decision carries and who may give it); raises ``GateDecisionError`` when none.
        The gate is being decided until ``apply_decision`` or ``release_decision``.

        A map's reconcile gate takes as ``output`` the outputs of items that were in flight and
        did happen: ``{"items": {"INDEX": output, ...}}`` (the others run again).
        """
        if output is not None and gate_id in self.state.expansions:
            problem = item_outputs_problem(output)
            if problem and self.state.gates.get(gate_id) is GateKind.RECONCILE:
                plan = self.state.plan
                raise GateDecisionError(plan.id, gate_id, revision, problem)
        return self.gates.check_decision(gate_id, revision, output, **given)

    def release_decision(self, gate_id: str) -> None:
        """A checked decision could not be recorded: the gate may be decided again."""
        self.gates.release(gate_id)

    def apply_decision(
        self,
        gate_id: str,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
        value: Any = None,
        has_value: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Act on a recorded decision (``Engine.decide``)."""
        try:
            if (
                output is not None
                and approve
                and self.state.gates.get(gate_id) is GateKind.RECONCILE
                and gate_id in self.state.expansions
            ):
                # A map's items that did happen are recorded done; the map runs the others.
                self.maps.reconciled(gate_id, output)
                output = None
            closed = self.gates.apply_decision(
                gate_id, approve, approver, rationale, output, value, has_value, arguments
            )
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            self.state.crash(exc)
            return
        if closed:
            self.scheduler.wake()

    def pause(self) -> None:
        """Start no new step; the run ends ``paused`` once the running steps finish."""
        self.state.pause()

    def cancel(self) -> None:
        """Cancel the running steps, compensate, end ``cancelled``."""
        self.state.cancel()

    async def execute(self) -> PlanResult[P]:
        """Run this revision to its end: the plan span, the scheduler, compensation, the result.

        Returns early after a replan (``replacement`` then holds the next revision's run).
        """
        state, deps, observer = self.state, self.deps, self.observer
        plan, agent = state.plan, deps.agent
        started = time.monotonic()
        logger.info(
            "plan %s@%d (%s): running %d steps", plan.id, plan.revision, agent, len(plan.steps)
        )
        with deps.tracer.start_as_current_span(
            f"invoke_agent {agent}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "gen_ai.agent.id": deps.agent_id,
                "stratagem.plan.id": plan.id,
                "stratagem.plan.revision": plan.revision,
            },
            links=self.links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            # Step and tool spans are made only under a recording plan span: a no-op tracer
            # (no provider set up) or a sampled-out plan then costs nothing per step.
            observer.started(span)
            now = self.admission.start()
            state.plan_running(
                now,
                (
                    # Also when this process does not trace: a run inside a caller's trace keeps
                    # that trace's id, so the history can name it.
                    _traceparent(span) if span.get_span_context().is_valid else ""
                ),
            )
            try:
                await self.scheduler.run(fresh=not self.restored)
                status = state.end_status()
                if self.gates.revision is not None and await self._edited():
                    span.set_attribute("stratagem.plan.status", "revised")
                    deps.metrics.plan_ended(agent, "revised")
                    return state.result(status, time.monotonic() - started)
                if status is PlanStatus.FAILED and await self._replan():
                    span.set_attribute("stratagem.plan.status", "replanned")
                    deps.metrics.plan_ended(agent, "replanned")
                    return state.result(status, time.monotonic() - started)
                if status is not PlanStatus.PAUSED:
                    state.close_gates()
                    state.skip_pending()
                if status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
                    await self.compensation.compensate(status)
                message = "the plan was paused" if status is PlanStatus.PAUSED else ""
                message = _summary(state.failures) or message
                if state.journal is not None:
                    state.plan_ended(status, message)
                    await state.journal.flush()
            except (asyncio.CancelledError, StoreError) as exc:
                await state.abort_journal()
                if isinstance(exc, asyncio.CancelledError):
                    reason, message = "cancelled", "the plan run was cancelled"
                else:
                    reason, message = str(exc), f"the plan run stopped: {exc}"
                span.set_attribute("stratagem.plan.status", PlanStatus.CANCELLED.value)
                span.set_status(Status(StatusCode.ERROR, reason))
                state.plan_event(PlanStatus.CANCELLED, message)
                deps.metrics.plan_ended(agent, "interrupted")
                logger.info("plan %s@%d: interrupted (%s)", plan.id, plan.revision, reason)
                raise
            finally:
                self.attempts.watchdog.close()
                self.gates.close()
            span.set_attribute("stratagem.plan.status", status.value)
            if status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
                span.set_status(Status(StatusCode.ERROR, message or status.value))
            state.plan_event(status, message)
        deps.metrics.plan_ended(agent, status.value)
        self.ended = status
        duration = time.monotonic() - started
        logger.info("plan %s@%d: %s in %.3fs", plan.id, plan.revision, status.value, duration)
        return state.result(status, duration)

    async def undo(self, status: PlanStatus) -> str:
        """Without a store: compensate this (nested) run's succeeded steps because its parent
        ended ``status``; why a compensation failed, or "". A run that ended failed or
        cancelled compensated itself already."""
        state = self.state
        if self.ended in (PlanStatus.FAILED, PlanStatus.CANCELLED):
            return ""
        state.cancel()
        try:
            await self.compensation.compensate(PlanStatus.CANCELLED)
        finally:
            self.attempts.watchdog.close()
        self.ended = PlanStatus.CANCELLED
        state.plan_event(PlanStatus.CANCELLED, f"the parent plan {status.value}")
        failed = [
            key for key, entry in state.compensation.items() if entry is CompensationStatus.FAILED
        ]
        return f"the compensation of {', '.join(failed)} failed" if failed else ""

    async def _edited(self) -> bool:
        """After an approval that edited a tool step's arguments: the plan's next revision,
        the step's input replaced by them, authored by the approver; True once it is made.

        The approval rides into the new revision (its first records), so the step runs there
        without asking again; the results of what completed carry over.
        """
        edit = self.gates.revision
        assert edit is not None
        state, deps = self.state, self.deps
        plan = state.plan
        if state.cancelled or state.failures:
            return False
        state.close_gates()
        state.skip_pending()
        if state.journal is not None:
            await state.journal.flush()
        steps = [
            step.model_copy(update={"input": edit.arguments}) if step.id == edit.step_id else step
            for step in plan.steps
        ]
        approval = GateRecord(
            plan.id,
            plan.revision + 1,
            edit.step_id,
            GateDecision.APPROVED,
            GateKind.TOOL,
            approver=edit.approver,
            rationale=edit.rationale,
        )
        tool = next(
            (s.tool for s in plan.steps if s.id == edit.step_id and isinstance(s, ToolStep)), ""
        )
        rationale = (
            f"the arguments of step {edit.step_id!r} (tool {tool!r}) were edited at its approval "
            f"by {edit.approver}" + (f": {edit.rationale}" if edit.rationale else "")
        )
        revision, recorded = await make_revision(
            plan,
            plan.model_copy(update={"steps": steps}),
            state.outputs,
            state.attempts,
            state.compensation,
            rationale,
            edit.approver,
            spent=(self.admission.spent_calls, self.admission.spent_cost),
            store=deps.store,
            clock=deps.clock,
            more=[approval],
        )
        logger.info(
            "plan %s: revision %d replaces %d: %s",
            plan.id,
            revision.revision,
            plan.revision,
            rationale,
        )
        run = _PlanRun(deps, cast(P, revision.plan), self.on_event)
        run.is_dag()
        run.restore(recorded)
        run.replans = self.replans
        self.replacement = run
        return True

    async def _replan(self) -> bool:
        """After a failure of a class the replanner takes (``logic`` unless it says), ask it for
        the next revision; True when it gave one.

        The current revision's run ends here (its gates closed, its pending steps skipped, its
        journal flushed), the revision is stored, and ``replacement`` holds the next run.
        """
        state, deps = self.state, self.deps
        replanner = deps.replanner
        if (
            replanner is None
            or state.cancelled
            or self.replans >= deps.config.max_replans
            or not deps.policy.may_replan(state.failures, replanned_classes(replanner))
        ):
            return False
        plan = state.plan
        failure = state.failures[0]
        try:
            made = replanner.replan(plan, failure)
            new_plan = await made if inspect.isawaitable(made) else made
        except Exception:
            logger.exception("plan %s: the replanner failed", plan.id)
            return False
        if new_plan is None:
            return False
        state.close_gates()
        state.skip_pending()
        if state.journal is not None:
            await state.journal.flush()
        rationale = replan_rationale(failure)
        try:
            revision, recorded = await make_revision(
                plan,
                new_plan,
                state.outputs,
                state.attempts,
                state.compensation,
                rationale,
                # A model's repair names the model (its provenance), else the agent's replanner.
                new_plan.provenance.author if new_plan.provenance else f"replanner:{deps.agent}",
                spent=(self.admission.spent_calls, self.admission.spent_cost),
                items={
                    expansion_key(step_id, index): output
                    for step_id, expanded in state.expansions.items()
                    for index, output in expanded.outputs.items()
                },
                maps={
                    step_id: MapRecord(
                        plan.id,
                        plan.revision,
                        step_id,
                        len(expanded.values),
                        list_digest(expanded.values),
                    )
                    for step_id, expanded in state.expansions.items()
                },
                store=deps.store,
                clock=deps.clock,
            )
        except PlanValidationError as exc:
            logger.error("plan %s: the replanner's plan is not a DAG: %s", plan.id, exc)
            return False
        logger.info(
            "plan %s: revision %d replaces %d (%d result(s) carried over)",
            plan.id,
            revision.revision,
            plan.revision,
            len(revision.record.carried),
        )
        run = _PlanRun(deps, cast(P, revision.plan), self.on_event)
        run.is_dag()
        run.restore(recorded)
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
