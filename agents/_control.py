"""Steering an agent's plans: gates, pause, cancel, resume, replan, fork, revisions and replay.

``PlanControl`` is the collaborator of ``Agent`` that acts on plans already made: the ``Control``
RPC and the methods behind it, the revision history, replay, and resumption — after a restart
every unfinished stored plan continues in a background task (``resume_unfinished``), and a control
call waits until such a task is live in the engine before it acts. ``Agent`` owns one and
delegates to it; it is built with a ``ControlDeps`` naming all it uses (it knows nothing else of
the agent), and the runs in flight it shares with the agent are a ``PlanRuns``, their one writer.
Refusals are ``RemoteError`` subclasses (``NotFoundError`` for an unknown plan,
``FailedPreconditionError`` for an action that does not apply).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from pydantic import ValidationError

from stratagem.agents._admission import planner_fields_set
from stratagem.agents._records import PlanBook, follow_revision
from stratagem.agents._runs import PlanRuns
from stratagem.agents._wire import (
    MESSAGE_LIMIT,
    digest_of_request,
    gate_output,
    goal_marked,
    invalid_argument,
    one_line,
    revision_entry,
)
from stratagem.planning import (
    Engine,
    ForkError,
    GateDeciderError,
    GateDecisionError,
    GateValueError,
    Plan,
    PlanControlError,
    PlanResult,
    PlanStatus,
    PlanValidationError,
    StateStore,
    StepEvent,
    StepFailure,
    failure_repaired,
)
from stratagem.planning import replay as replay_plan
from stratagem.protocol import (
    CAPABILITIES,
    CallContext,
    ControlRequest,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PlanRevision,
    PlanSnapshot,
    Policy,
    ReplayDivergence,
    ReplayResult,
    RevisionsResponse,
    json_object,
    json_value,
)

__all__ = ["NO_VALUE", "ControlDeps", "PlanControl"]

logger = logging.getLogger(__name__)

NO_VALUE: Any = object()
"""``decide_gate``'s ``value`` when none is given (``None`` is JSON's null)."""


def _fork_id(plan_id: str) -> str:
    """A fresh id for a fork of ``plan_id`` (within the plan id's length)."""
    return f"{plan_id[:180]}-fork-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class ControlDeps:
    """What ``PlanControl`` uses, and all it may touch (``Agent`` makes it).

    Attributes:
        role: The agent's role.
        plan_type: The agent's plan type (stored plans are read as it).
        engine: The agent's engine (it decides, pauses, cancels, resumes, replans, forks).
        store: The engine's store (``None``: nothing is stored, little can be steered).
        book: The records of the agent's plans.
        runs: The plans running here and the tasks carrying them (shared with the agent).
        problems: Why the agent may not run a plan (empty when it may).
        policy: Who may decide gates (roles, an agent's default deciders) as the agent's policy
            says now; ``None``: anyone allowed to call ``Control.approve``.
        planner_of: The planner serving a capability (``None`` if none), for ``replay`` to
            re-derive a model's plan.
    """

    role: str
    plan_type: type[Plan]
    engine: Engine
    store: StateStore | None
    book: PlanBook
    runs: PlanRuns
    problems: Callable[[Plan], list[str]]
    policy: Callable[[], Policy | None]
    planner_of: Callable[[str], object | None]


class PlanControl:
    """Control, revisions, replay and resumption of an agent's plans (``Agent`` delegates).

    Args:
        deps: All it uses.
    """

    def __init__(self, deps: ControlDeps) -> None:
        self._deps = deps
        self.role = deps.role
        self._plan_type = deps.plan_type
        self._engine = deps.engine
        self._store = deps.store
        self._book = deps.book
        self._runs = deps.runs

    async def control(self, request: ControlRequest, ctx: CallContext) -> PlanSnapshot:
        """Serve ``Control``: one control action on one plan, decided by the verified caller.

        Args:
            request: The action (``approve``, ``reject``, ``pause``, ``cancel``, ``resume``,
                ``replan``), the plan, for a gate decision the gate, rationale, revision (0: the
                plan's current one) and optionally the output to record for a reconcile gate, and
                for ``replan`` the new plan's JSON and the rationale.
            ctx: The call being served; its caller is the approver (or the revision's author).

        Returns:
            The plan's state after the action took effect.

        Raises:
            protocol.NotFoundError: The agent has no such plan.
            protocol.FailedPreconditionError: The action does not apply (see the methods).
            protocol.InvalidArgumentError: ``output_json`` is not a JSON object.
        """
        match request.action:
            case "approve" | "reject":
                output = gate_output(request.output_json)
                given: dict[str, Any] = {}
                if request.value_json:
                    given["value"] = json_value(request.value_json, "value_json")
                if request.arguments_json:
                    given["arguments"] = json_object(request.arguments_json, "arguments_json")
                return await self.decide_gate(
                    request.plan_id,
                    request.gate_id,
                    approve=request.action == "approve",
                    approver=ctx.caller,
                    rationale=request.rationale,
                    revision=request.revision or None,
                    output=output,
                    **given,
                )
            case "fork":
                outputs = json_object(request.set_json, "set_json") if request.set_json else {}
                return await self.fork(
                    request.plan_id,
                    at_step=request.at_step or None,
                    revision=request.at_revision or None,
                    outputs=outputs,
                    new_plan_id=request.new_plan_id,
                    author=ctx.caller,
                    rationale=request.rationale,
                )
            case "pause":
                return await self.pause(request.plan_id)
            case "cancel":
                return await self.cancel(request.plan_id)
            case "resume":
                return await self.resume(request.plan_id)
            case "replan":
                return await self.replan(
                    request.plan_id,
                    request.plan_json,
                    rationale=request.rationale,
                    author=ctx.caller,
                )
            case _:
                assert_never(request.action)

    async def replan(
        self, plan_id: str, plan_json: str, *, rationale: str, author: str
    ) -> PlanSnapshot:
        """Make a new revision of a stored plan that is not running here; ``resume`` runs it.

        The new revision keeps the plan's id; the results of unchanged completed steps carry over
        (``docs/durability.md``). It is validated against this agent's registry like any plan.

        Args:
            plan_id: The plan.
            plan_json: The new revision's plan, as JSON of this agent's plan type.
            rationale: Why the plan changes (kept with the revision).
            author: Who changes it (over the wire: the verified caller).

        Returns:
            The plan's state: the new revision, not yet started.

        Raises:
            protocol.NotFoundError: No such plan here.
            protocol.InvalidArgumentError: ``plan_json`` is not a plan of this agent's type, or
                it sets a planner's field (``planner_fields_set``) to a value of its own.
            protocol.FailedPreconditionError: The plan is running here (pause it first), stopped
                with a step in flight, the agent has no store, or the new plan fails validation.
        """
        await self._runs.ready(plan_id)
        await self._revision_of(plan_id)
        raw = json_object(plan_json, "the plan")
        raw = {**raw, "id": plan_id}
        try:
            new_plan = self._plan_type.model_validate(raw)
        except ValidationError as exc:
            raise invalid_argument(f"not a valid {self._plan_type.__name__}", exc) from None
        asked = planner_fields_set(
            new_plan, self._plan_type, replacing=self._book.record(plan_id).plan
        )
        if asked:
            raise InvalidArgumentError(
                one_line(f"replan of {plan_id!r} refused: " + "; ".join(asked))
            )
        problems = self._deps.problems(new_plan)
        if problems:
            raise FailedPreconditionError(
                one_line(f"replan of {plan_id!r} refused: " + "; ".join(problems))
            )
        if self._runs.is_active(plan_id):
            raise FailedPreconditionError(
                f"plan {plan_id!r} is running; pause it before replanning"
            )
        try:
            revision = await self._engine.replan(
                plan_id, new_plan, rationale=rationale, author=author
            )
        except (PlanControlError, PlanValidationError) as exc:
            raise FailedPreconditionError(one_line(str(exc))) from exc
        logger.info(
            "agent %s plan %s revision %d made by %s",
            self.role,
            plan_id,
            revision.record.revision,
            author,
        )
        return await self._settled(plan_id)

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """Serve ``Revisions``: the plan's revision history from the store, oldest first.

        Revisions made by a replan carry their parent, author, rationale and diff; the plan's
        first revision is listed with parent 0.

        Raises:
            protocol.NotFoundError: No such plan in the store (or the agent has no store).
        """
        state = await self._store.load(plan_id) if self._store is not None else None
        if self._store is None or state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        records = await self._store.revisions(plan_id)
        listed = [revision_entry(record) for record in records]
        first = records[0].parent if records and records[0].parent else None
        if not records:
            first = state.revision
        if first is not None:
            listed.insert(0, PlanRevision(revision=first))
        return RevisionsResponse(plan_id=plan_id, agent=self.role, revisions=listed)

    async def replay(
        self,
        plan_id: str,
        ctx: CallContext | None = None,
        *,
        outputs: Mapping[str, dict[str, Any]] | None = None,
    ) -> ReplayResult:
        """Serve ``Replay``: re-run a finished plan from its recorded outputs and compare.

        Nothing outside the engine runs (``planning.replay``): tool and cross-agent steps get
        their recorded outcomes, gates their recorded decisions.

        Args:
            plan_id: The plan; it must be finished.
            ctx: The call being served (unused: replay has no effects to attribute).
            outputs: Step id -> an output to serve instead of the recorded one (what if the
                step had answered that?); not offered over the wire.

        Returns:
            The report: how many decisions were compared, and each that differs.

        Raises:
            protocol.NotFoundError: No such plan in the store (or the agent has no store).
            protocol.FailedPreconditionError: The plan is not finished.
        """
        state = await self._store.load(plan_id) if self._store is not None else None
        if self._store is None or state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        try:
            report = await replay_plan(
                self._store, plan_id, plan_type=self._plan_type, outputs=outputs
            )
        except PlanControlError as exc:
            raise FailedPreconditionError(one_line(str(exc))) from exc
        plan = state.plan(self._plan_type)
        steps = len(plan.steps)
        # A model's plan: re-derived from the model calls journaled with it, no model asked,
        # the first revision and every repair the model made while it ran.
        rederived: list[str] | None = None
        capability = plan.provenance.capability if plan.provenance is not None else ""
        rederive = getattr(self._deps.planner_of(capability), "rederive", None)
        if callable(rederive) and plan.provenance is not None:
            repaired = await self._model_repairs(plan_id, plan.revision)
            if repaired is not None:
                request = plan.provenance.request
                rederived = await rederive(
                    plan, repaired, served=lambda first: self._served(first, capability, request)
                )
        model = [
            ReplayDivergence(
                step_id="",
                decision="model plan",
                recorded="the plan journaled",
                replayed=difference[:MESSAGE_LIMIT],
            )
            for difference in rederived or []
        ]
        return ReplayResult(
            plan_id=plan_id,
            agent=self.role,
            revision=report.revision,
            recorded_status=report.recorded_status.value,
            replayed_status=report.replayed_status.value if report.replayed_status else "",
            # Per step: order, outcomes, status, output; then the plan's status (and the model
            # plan's derivation, for a model's plan).
            decisions=4 * steps + 1 + (rederived is not None),
            divergences=model
            + [
                ReplayDivergence(
                    step_id=d.step_id,
                    decision=d.decision,
                    recorded=d.recorded[:MESSAGE_LIMIT],
                    replayed=d.replayed[:MESSAGE_LIMIT],
                )
                for d in report.divergences
            ],
        )

    async def _model_repairs(self, plan_id: str, revision: int) -> list[StepFailure] | None:
        """The failure each revision before ``revision`` ended with, when every later revision
        is a model's repair of it (``None``: a revision was made another way, say an operator's
        replan, so the journal alone cannot re-derive the plan)."""
        if revision == 1 or self._store is None:
            return []
        failures: list[StepFailure] = []
        for record in await self._store.revisions(plan_id):
            if record.revision < 2 or record.revision > revision:
                continue
            failure = failure_repaired(record)
            if failure is None or not record.author.startswith("model:"):
                return None
            failures.append(failure)
        return failures if len(failures) == revision - 1 else None

    def _served(self, plan: Plan, capability: str, request: Mapping[str, Any]) -> Plan:
        """``plan`` as the agent ran it: its goal marked with the request's digest."""
        spec = CAPABILITIES.get(capability)
        if spec is None:
            return plan
        wire = spec.request.model_validate(request)
        return plan.model_copy(
            update={"goal": goal_marked(plan.goal, digest_of_request(capability, wire))}
        )

    async def decide_gate(
        self,
        plan_id: str,
        gate_id: str,
        *,
        approve: bool,
        approver: str,
        rationale: str,
        revision: int | None = None,
        output: dict[str, Any] | None = None,
        value: Any = NO_VALUE,
        arguments: dict[str, Any] | None = None,
    ) -> PlanSnapshot:
        """Approve or reject a gate (a gate step, or a reconcile, policy or tool gate named
        after its step).

        The decision is recorded before it is acted on; a plan running here goes on at once, and
        so does a stored, unpaused plan that no run carries on any more (its runner ended with
        an abandoned call): the agent resumes it from its store. A paused plan acts on the
        decision when resumed (``docs/durability.md``).

        Args:
            plan_id: The plan.
            gate_id: The gate step's id, or the id of the step to reconcile.
            approve: Approve (True) or reject (False).
            approver: Who decides (over the wire: the verified caller).
            rationale: Why.
            revision: The plan revision the decision is for; ``None`` for the current one.
            output: For a reconcile gate: record the step as done with this output instead of
                re-running it.
            value: For an approval of a gate that asks: its value (omit it otherwise).
            arguments: For an approval of a tool gate: the tool's arguments as edited (the plan
                goes on as a new revision whose author is ``approver``).

        Returns:
            The plan's state after the decision.

        Raises:
            protocol.NotFoundError: No such plan here.
            protocol.PermissionDeniedError: ``approver`` is not among the gate's deciders (nor
                in a role it names; without its own, the agent's policy's ``[[gate]]``).
            protocol.InvalidArgumentError: The value (or the arguments) does not fit the gate;
                the violation names the field.
            protocol.FailedPreconditionError: The gate is unknown, not open or already decided,
                the revision is not the plan's, or ``output`` was given for a gate step.
        """
        await self._runs.ready(plan_id)
        current = await self._revision_of(plan_id)
        policy, role = self._deps.policy(), self.role
        given: dict[str, Any] = {}
        if value is not NO_VALUE:
            given["value"] = value
        try:
            await self._engine.decide(
                plan_id,
                gate_id,
                approve=approve,
                approver=approver,
                rationale=rationale,
                revision=current if revision is None else revision,
                output=output,
                arguments=arguments,
                may_decide=(
                    None
                    if policy is None
                    else lambda deciders: policy.may_decide(approver, deciders, role)
                ),
                **given,
            )
        except GateDeciderError as exc:
            raise PermissionDeniedError(one_line(str(exc))) from exc
        except GateValueError as exc:
            raise InvalidArgumentError(
                one_line(str(exc)), violations=(FieldViolation(exc.field, exc.reason),)
            ) from exc
        except (GateDecisionError, PlanControlError) as exc:
            raise FailedPreconditionError(one_line(str(exc))) from exc
        logger.info(
            "agent %s plan %s gate %s %s by %s",
            self.role,
            plan_id,
            gate_id,
            "approved" if approve else "rejected",
            approver,
        )
        await self._continue_orphan(plan_id)
        return await self._settled(plan_id)

    async def fork(
        self,
        plan_id: str,
        *,
        at_step: str | None = None,
        revision: int | None = None,
        outputs: Mapping[str, Any] | None = None,
        new_plan_id: str = "",
        author: str,
        rationale: str = "",
    ) -> PlanSnapshot:
        """Fork a stored plan into a new one that runs on from the fork point (``Engine.fork``:
        the steps before it carry their recorded results, ``outputs`` substitutes some).

        The new plan runs here in a background task, like a resumed one.

        Args:
            plan_id: The plan forked.
            at_step: The fork point (``None``: the end of the revision).
            revision: The revision forked (``None``: the newest).
            outputs: Step id -> an output (a JSON object) substituted for its recorded one.
            new_plan_id: The new plan's id ("" : ``<plan_id>-fork-<hex>``).
            author: Who forks it (over the wire: the verified caller).
            rationale: Why (logged; the audit record keeps it).

        Returns:
            The new plan's state as it starts.

        Raises:
            protocol.NotFoundError: No such plan here (or no store).
            protocol.InvalidArgumentError: No such fork point, or an output for a step that is
                not before it (the violation names ``at_step``, ``revision`` or ``set.<step>``).
            protocol.FailedPreconditionError: ``new_plan_id`` is taken, or the plan cannot run
                here any more (its tools changed).
        """
        state = await self._store.load(plan_id) if self._store is not None else None
        if self._store is None or state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        new_id = new_plan_id or _fork_id(plan_id)
        try:
            plan = await self._engine.fork(
                plan_id,
                new_id,
                at_step=at_step,
                revision=revision,
                outputs=outputs,
                author=author,
                plan_type=self._plan_type,
            )
        except ForkError as exc:
            raise InvalidArgumentError(
                one_line(str(exc)), violations=(FieldViolation(exc.field, exc.reason),)
            ) from exc
        except PlanControlError as exc:
            raise FailedPreconditionError(one_line(str(exc))) from exc
        logger.info(
            "agent %s plan %s forked from %s by %s: %s",
            self.role,
            new_id,
            plan_id,
            author,
            rationale,
        )
        problems = self._deps.problems(plan)
        if problems:
            raise FailedPreconditionError(
                one_line(f"fork {new_id!r} of {plan_id!r} cannot run here: " + "; ".join(problems))
            )
        self.start_resume(new_id)
        await self._runs.ready(new_id)
        return await self._settled(new_id)

    async def _continue_orphan(self, plan_id: str) -> None:
        """Resume a stored plan that no run here carries on (its runner went with an abandoned
        call, ``plans run`` past its deadline): the decision just recorded then takes effect
        now, not at an unannounced ``resume``. A paused plan stays paused."""
        if self._store is None or self._runs.is_active(plan_id):
            return
        state = await self._store.load(plan_id)
        if state is None or state.status.is_final or state.status is PlanStatus.PAUSED:
            return
        logger.info("agent %s resumes plan %s: its runner is gone", self.role, plan_id)
        self.start_resume(plan_id)
        await self._runs.ready(plan_id)

    async def pause(self, plan_id: str) -> PlanSnapshot:
        """Pause a plan: no new step starts, running ones finish; ``resume`` continues it.

        Raises:
            protocol.NotFoundError: No such plan here.
            protocol.FailedPreconditionError: The plan is finished.
        """
        return await self._stop(plan_id, self._engine.pause)

    async def cancel(self, plan_id: str) -> PlanSnapshot:
        """Cancel a plan for good: running steps are cancelled, completed ones compensated.

        Raises:
            protocol.NotFoundError: No such plan here.
            protocol.FailedPreconditionError: The plan is finished.
        """
        return await self._stop(plan_id, self._engine.cancel)

    async def _stop(self, plan_id: str, action: Callable[[str], Awaitable[object]]) -> PlanSnapshot:
        """Pause or cancel through the engine, once the plan is known here and loaded."""
        await self._runs.ready(plan_id)
        await self._revision_of(plan_id)
        try:
            await action(plan_id)
        except PlanControlError as exc:
            raise FailedPreconditionError(one_line(str(exc))) from exc
        return await self._settled(plan_id)

    async def resume(self, plan_id: str) -> PlanSnapshot:
        """Continue a stored, unfinished plan that is not running (paused, or left by a stop).

        The plan runs on in a background task; the snapshot is its state as it starts.

        Raises:
            protocol.NotFoundError: No such plan in the store (or the agent has no store).
            protocol.FailedPreconditionError: The plan is running already, or finished.
        """
        state = await self._store.load(plan_id) if self._store is not None else None
        if state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        if self._runs.is_active(plan_id):
            raise FailedPreconditionError(f"plan {plan_id!r} is already running")
        if state.status.is_final:
            raise FailedPreconditionError(f"plan {plan_id!r} is already {state.status.value}")
        self.start_resume(plan_id)
        await self._runs.ready(plan_id)
        return await self._settled(plan_id)

    async def resume_unfinished(self, *, resume: bool = True) -> list[str]:
        """Take up the unfinished plans of the store, each in a background task: those that still
        have a reason to run are resumed, the others cancelled for good.

        Called when the agent starts (for an actor, after every restart). A plan that waits at a
        gate waits again for its decision; a paused plan is remembered but stays paused. A plan
        whose caller's deadline (``Plan.deadline``) passed has no one to answer: it is cancelled
        (recorded ``cancelled``, its completed steps compensated), not run again.

        Args:
            resume: ``False`` resumes nothing (``stratagem secret rotate`` redeploys the agents:
                the callers of every plan that was running went with the old ones): running plans
                are cancelled, paused and gated ones stay stored as they are (a gate's decision
                takes the plan up again).

        Returns:
            The ids of the plans resumed.
        """
        if self._store is None:
            return []
        resumed: list[str] = []
        cancelled: list[str] = []
        now = time.time()
        for plan_id in await self._store.unfinished():
            if self._runs.is_active(plan_id):
                continue
            state = await self._store.load(plan_id)
            if state is None:
                continue
            plan = state.plan(self._plan_type)
            self._book.recall(plan, state)
            if state.status is PlanStatus.PAUSED or plan.parent is not None:
                continue  # a nested plan is resumed by the step of its parent that runs it
            if state.status is PlanStatus.BLOCKED and not resume:
                continue
            if not resume or (plan.deadline is not None and plan.deadline <= now):
                self._start_cancel(plan_id)
                cancelled.append(plan_id)
                continue
            self.start_resume(plan_id)
            resumed.append(plan_id)
        if resumed:
            logger.info("agent %s resumed %d unfinished plans", self.role, len(resumed))
        if cancelled:
            logger.info(
                "agent %s cancelled %d unfinished plans whose callers are gone (%s)",
                self.role,
                len(cancelled),
                "its agents were redeployed" if not resume else "their deadlines passed",
            )
        return resumed

    def _start_cancel(self, plan_id: str) -> None:
        """Cancel the stored plan ``plan_id`` in a background task, which a call for the plan
        meanwhile joins instead of running it again."""
        self._runs.background(
            plan_id,
            lambda _started: self._cancel_stored(plan_id),
            name=f"cancel {plan_id}",
            live=True,
        )

    async def _cancel_stored(self, plan_id: str) -> PlanResult[Any]:
        """Cancel a stored plan no run carries (recorded, compensated), and its final state."""
        assert self._store is not None
        await self._engine.cancel(plan_id)
        state = await self._store.load(plan_id)
        if state is not None:
            self._book.recall(state.plan(self._plan_type), state)
        return await self._engine.resume(plan_id, plan_type=self._plan_type)

    async def _revision_of(self, plan_id: str) -> int:
        """The plan's current revision, from the store or the records (``NotFoundError``)."""
        if self._store is not None:
            state = await self._store.load(plan_id)
            if state is not None:
                if plan_id not in self._book:
                    self._book.recall(state.plan(self._plan_type), state)
                return state.revision
        return self._book.record(plan_id).plan.revision

    async def _settled(self, plan_id: str) -> PlanSnapshot:
        """The plan's snapshot once a control action was taken, refreshed from the store when no
        run here reports its events."""
        # Let a run woken by the action take its next step before the snapshot is taken.
        await asyncio.sleep(0)
        if self._store is not None and not self._runs.is_active(plan_id):
            state = await self._store.load(plan_id)
            if state is not None:
                return self._book.recall(state.plan(self._plan_type), state).snapshot(self.role)
        return self._book.record(plan_id).snapshot(self.role)

    def start_resume(self, plan_id: str, capability: str = "") -> asyncio.Task[PlanResult[Any]]:
        """Carry the stored plan ``plan_id`` on in a background task (the one already doing so,
        if any); ``capability``: the capability it serves, when known."""
        return self._runs.background(
            plan_id,
            lambda started: self._resume(plan_id, capability, started),
            name=f"resume {plan_id}",
        )

    async def _resume(
        self, plan_id: str, capability: str, started: asyncio.Event
    ) -> PlanResult[Any]:
        assert self._store is not None
        state = await self._store.load(plan_id)
        if state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        record = self._book.recall(state.plan(self._plan_type), state)
        if capability:
            record.capability = capability

        def on_event(event: StepEvent) -> None:
            started.set()
            self._book.observe(record, event)

        result = await self._engine.resume(plan_id, plan_type=self._plan_type, on_event=on_event)
        record.status = result.status
        record.result = result
        follow_revision(record, result)
        return result
