"""The ``Agent`` base: a role with a tool registry, a typed plan, planners and an engine.

An agent serves capabilities. For each request it asks the capability's planner for a plan, checks
the plan against its own registry (a plan may name only this agent's tools, or cross-agent steps),
runs it with the engine, and turns the result into the capability's response. It keeps a record of
its recent plans and their events, which ``watch`` streams and ``plans`` snapshots.

Given a ``planning.StateStore``, the agent's engine keeps every plan durably, and the agent can be
steered and restarted: ``decide_gate``, ``pause``, ``cancel`` and ``resume`` act on one plan
(``control`` serves them over the wire, with the verified caller as the approver), and
``resume_unfinished`` reloads every unfinished plan from the store after a restart and continues
each in a background task (a plan waiting at a gate waits again; a paused plan stays paused). A
request whose plan id names an unfinished stored plan (a caller retrying after this agent
restarted) joins that plan instead of starting it again; one whose plan id names a plan that
already **succeeded** for the same request (the agent died before its server stored the answer) is
answered from the stored outputs without running anything. ``replan`` makes a new revision of a
stopped plan, ``revisions`` lists the history and ``replay`` re-derives a finished plan's
decisions from its records.

An ``Agent`` satisfies ``protocol.AgentBackend`` structurally, so ``protocol.AgentServer`` serves it
over gRPC; ``planning.InMemoryDispatcher`` can serve it in-process (see :func:`serve_in_memory`).

Refusals and failures are raised as protocol ``RemoteError`` subclasses, one per failure class:

==========================  ========================================================================
situation                   raised
==========================  ========================================================================
unknown capability          ``NotFoundError``
request of the wrong model  ``InvalidArgumentError`` (with field violations)
plan fails validation       ``FailedPreconditionError`` naming every problem (e.g. a step naming a
                            tool outside this agent's registry). The request was well formed; the
                            plan made for it (or submitted) cannot run here, so retrying the same
                            request cannot help.
step failed: logic          ``FailedPreconditionError``
step failed: policy         ``PermissionDeniedError``
step failed: timeout        ``DeadlineExceededError``
step failed: transient      ``UnavailableError``
plan cancelled              ``CancelledError``
control of an unknown plan  ``NotFoundError``
control refused             ``FailedPreconditionError`` (a gate not open, a finished plan, a plan
                            already running, another revision)
==========================  ========================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, assert_never

from opentelemetry.trace import TracerProvider
from pydantic import ValidationError

from stratagem.agents._records import (
    _TERMINAL,
    MAX_RECORDS,
    WATCH_QUEUE_LIMIT,
    PlanRecord,
    _matches,
)
from stratagem.agents._tool import ToolRegistry
from stratagem.agents._wire import (
    _MESSAGE_LIMIT,
    _coerce,
    _error_class,
    _invalid,
    _marked,
    _one_line,
    _output_of,
    _reason,
    _recorded_digest,
    _request_digest,
    _revision_entry,
)
from stratagem.planning import (
    Dispatcher,
    Engine,
    EngineConfig,
    FailureClass,
    GateDecision,
    GateDecisionError,
    Handler,
    InMemoryDispatcher,
    Plan,
    PlanControlError,
    PlanningError,
    PlanResult,
    PlanState,
    PlanStatus,
    PlanValidationError,
    StateStore,
    StepError,
    StepEvent,
    StepFailure,
    StepStatus,
    validate_plan,
)
from stratagem.planning import replay as replay_plan
from stratagem.protocol import (
    CAPABILITIES,
    AgentCard,
    CallContext,
    CancelledError,
    CapabilityCard,
    CapabilitySpec,
    ControlRequest,
    FailedPreconditionError,
    InternalError,
    NotFoundError,
    PlanEvent,
    PlanRevision,
    PlanSnapshot,
    RemoteError,
    ReplayDivergence,
    ReplayResult,
    ResourceExhaustedError,
    RevisionsResponse,
    WireModel,
    current_call,
    json_object,
)

__all__ = ["Agent", "PlanRecord", "Planner", "serve_in_memory"]

logger = logging.getLogger(__name__)


def _package_version() -> str:
    try:
        return importlib.metadata.version("stratagem")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class Planner(Protocol):
    """Turns a capability request into a plan, and the plan's result into the response."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        """The plan that serves ``request``.

        Args:
            capability: The capability's name.
            request: The validated request model.
            plan_id: The id the plan must carry.

        Returns:
            A plan of the agent's plan type, owned by the agent's role.
        """
        ...

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The capability's response, built from a succeeded plan's outputs."""
        ...


def _follow_revision(record: PlanRecord, result: PlanResult[Any]) -> None:
    # The engine may have replaced the plan by a new revision mid-run (a replan after a logic
    # failure); the record shows the revision that ran last.
    if result.submitted.revision != record.plan.revision:
        record.plan = result.submitted


class _PlannerReplanner:
    """The engine's ``Replanner``: asks the planner that made a plan for its next revision.

    A planner takes part by having a ``replan(plan, failure) -> Plan | None`` method; plans
    submitted directly (no capability) and planners without one are not replanned.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        record = self._agent._records.get(plan.id)
        handler = self._agent._handlers.get(record.capability) if record is not None else None
        replan = getattr(handler[1], "replan", None) if handler is not None else None
        if not callable(replan):
            return None
        new_plan = replan(plan, failure)
        return new_plan if isinstance(new_plan, Plan) else None


class Agent:
    """A role agent: registry, typed plans, planners, engine and a record of its plans.

    Args:
        role: The agent's role, e.g. ``"perception"``.
        registry: The only tools its plans may name.
        plan_type: The typed plan its planners produce (a ``planning.Plan`` subclass); plans
            submitted with :meth:`submit_plan` are read as this type.
        planner: The planner of every built-in capability the protocol assigns to ``role``.
        dispatcher: Sends cross-agent steps (required for plans that have them).
        engine_config: The engine's limits and seed.
        tracer_provider: Where the engine's spans go (the global provider by default).
        max_records: How many plans to remember.
        store: Where the engine keeps plans durably; ``None`` keeps nothing (no resume, and gates
            work only while their plan runs).
    """

    def __init__(
        self,
        role: str,
        registry: ToolRegistry,
        plan_type: type[Plan],
        planner: Planner,
        *,
        dispatcher: Dispatcher | None = None,
        engine_config: EngineConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        max_records: int = MAX_RECORDS,
        store: StateStore | None = None,
    ) -> None:
        self._role = role
        self.registry = registry
        self.plan_type = plan_type
        self.planner = planner
        self.dispatcher = dispatcher
        self.version = _package_version()
        self._engine = Engine(
            engine_config,
            tools=registry,
            dispatcher=dispatcher,
            agent=role,
            tracer_provider=tracer_provider,
            store=store,
            replanner=_PlannerReplanner(self),
        )
        self.store = store
        # Plans running through ``_run`` here, and background resumptions, by plan id.
        self._active: set[str] = set()
        self._tasks: dict[str, asyncio.Task[PlanResult[Any]]] = {}
        # Set once a background resumption's run is live in the engine (its first event) or over,
        # so a control call never races the engine's own load of the plan.
        self._started: dict[str, asyncio.Event] = {}
        self._handlers: dict[str, tuple[CapabilitySpec, Planner]] = {}
        self._records: OrderedDict[str, PlanRecord] = OrderedDict()
        self._max_records = max_records
        self._seq = itertools.count(1)
        self._watchers: set[asyncio.Queue[tuple[int, PlanEvent]]] = set()
        self._lagging: set[asyncio.Queue[tuple[int, PlanEvent]]] = set()
        for spec in CAPABILITIES.values():
            if spec.role == role:
                self._handlers[spec.name] = (spec, planner)

    # --- what the agent is ---------------------------------------------------------------------

    @property
    def role(self) -> str:
        """The agent's role."""
        return self._role

    @property
    def capabilities(self) -> Mapping[str, CapabilitySpec]:
        """The capabilities it serves, by name."""
        return {name: spec for name, (spec, _) in self._handlers.items()}

    def add_capability(self, spec: CapabilitySpec, planner: Planner) -> None:
        """Serve another capability (an extension's), planned by ``planner``.

        Args:
            spec: The capability; its ``role`` must be this agent's role, and it must be in the
                protocol's registry (``protocol.register_capability``) so peers can encode it.
            planner: Plans it and builds its response.

        Raises:
            ValueError: The spec is for another role, is not registered, or the name is taken.
        """
        if spec.role != self.role:
            raise ValueError(f"capability {spec.name!r} is served by {spec.role}, not {self.role}")
        if CAPABILITIES.get(spec.name) != spec:
            raise ValueError(
                f"capability {spec.name!r} is not registered; call protocol.register_capability"
            )
        if spec.name in self._handlers and self._handlers[spec.name][0] != spec:
            raise ValueError(f"the {self.role} agent already serves {spec.name!r}")
        self._handlers[spec.name] = (spec, planner)

    def card(self) -> AgentCard:
        """The agent's card: role, version, capabilities with their JSON Schemas, tool names."""
        return AgentCard(
            role=self.role,
            version=self.version,
            capabilities=[CapabilityCard.from_spec(spec) for spec, _ in self._handlers.values()],
            tools=self.registry.names(),
        )

    # --- serving requests ----------------------------------------------------------------------

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel:
        """Serve one capability request: plan, validate, run, respond.

        The plan's id is ``"<caller plan>/<caller step>"`` when the caller runs a plan, else the
        request's own ``plan_id`` field when it has a non-empty one, else ``"<role>-<random>"``.

        Args:
            capability: The capability's name.
            request: The request (an instance of the capability's request model).
            ctx: The call being served.

        Returns:
            The capability's response model.

        Raises:
            protocol.RemoteError: A subclass per refusal or failure class (see the module
                docstring); the message is one line naming the plan and the step.
        """
        handler = self._handlers.get(capability)
        if handler is None:
            raise NotFoundError(f"the {self.role} agent does not serve {capability!r}")
        spec, planner = handler
        request = _coerce(spec, request)
        plan_id = self._plan_id_for(request, ctx)
        request_digest = _request_digest(capability, request)
        if self.store is not None:
            state = await self._served_before(plan_id, capability, request_digest)
            if state is not None:
                return self._respond_from(state, capability, request, planner)
        try:
            plan = planner.plan(capability, request, plan_id=plan_id)
        except (PlanningError, ValueError) as exc:
            message = _one_line(f"{capability}: cannot plan {plan_id!r}: {_reason(exc)}")
            # An id no plan may carry cannot be recorded; the caller still gets the error.
            with contextlib.suppress(ValidationError):
                stub = Plan(id=plan_id, owner=self.role, goal=capability)
                self._refuse(stub, capability, message)
            if isinstance(exc, StepError):
                raise _error_class(exc.failure_class)(message) from exc
            raise FailedPreconditionError(message) from exc
        if self.store is not None:
            plan = plan.model_copy(update={"goal": _marked(plan.goal, request_digest)})
        result = await self._run(plan, capability)
        if result.status is not PlanStatus.SUCCEEDED:
            raise self._failure(result)
        return self._respond(planner, capability, request, result)

    def _respond(
        self, planner: Planner, capability: str, request: WireModel, result: PlanResult[Any]
    ) -> WireModel:
        try:
            return planner.respond(capability, request, result)
        except (ValidationError, PlanningError, KeyError, ValueError) as exc:
            logger.exception(
                "plan %s: building the %s response failed", result.submitted.id, capability
            )
            raise InternalError(f"{capability}: the response could not be built") from exc

    async def _served_before(
        self, plan_id: str, capability: str, request_digest: str
    ) -> PlanState | None:
        """The stored state of ``plan_id`` when it already succeeded for this very request.

        This closes the gap the server's answer store leaves: when this agent died after the plan
        succeeded but before the answer was stored, the repeated request is answered from the
        plan's recorded outputs and nothing runs again.

        Raises:
            protocol.FailedPreconditionError: The plan id already served a different request, and
                that plan succeeded or is still going (a failed or cancelled one may be retried
                with another request, e.g. by a caller that replanned the step).
        """
        assert self.store is not None
        state = await self.store.load(plan_id)
        if state is None:
            return None
        recorded = _recorded_digest(state.plan_json)
        if recorded is None:
            # Not made for a request (a user's plan), or stored before digests were kept.
            return None
        if recorded != request_digest:
            if state.status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
                return None
            raise FailedPreconditionError(
                f"{capability}: plan {plan_id!r} was already made for a different request"
            )
        return state if state.status is PlanStatus.SUCCEEDED else None

    def _respond_from(
        self, state: PlanState, capability: str, request: WireModel, planner: Planner
    ) -> WireModel:
        """The response of a plan that already succeeded, from its recorded outputs."""
        plan = state.plan(self.plan_type)
        result: PlanResult[Any] = PlanResult(
            status=PlanStatus.SUCCEEDED,
            outputs=state.outputs,
            failures=[],
            statuses={
                step.id: state.steps[step.id].status if step.id in state.steps else step.status
                for step in plan.steps
            },
            events=0,
            duration_s=0.0,
            submitted=plan,
        )
        record = self._recall(plan, state)
        record.capability = capability
        record.result = result
        logger.info(
            "agent %s: plan %s already succeeded for this %s request; answered from the store",
            self.role,
            plan.id,
            capability,
        )
        return self._respond(planner, capability, request, result)

    async def submit_plan(self, plan: Plan | Mapping[str, Any]) -> PlanResult[Any]:
        """Run a plan given by a user (validated exactly like a planner's plan).

        Args:
            plan: The plan, or its JSON-like form (read as this agent's plan type).

        Returns:
            The run's result, whether it succeeded or failed.

        Raises:
            protocol.InvalidArgumentError: A mapping that is not a valid plan of this type.
            protocol.FailedPreconditionError: The plan fails validation (for example a step names
                a tool outside this agent's registry); the message names every problem.
        """
        if isinstance(plan, Plan):
            typed = plan
        else:
            try:
                typed = self.plan_type.model_validate(plan)
            except ValidationError as exc:
                raise _invalid(f"not a valid {self.plan_type.__name__}", exc) from None
        return await self._run(typed, "")

    async def run_plan(self, plan_json: str, ctx: CallContext) -> PlanSnapshot:
        """Serve ``RunPlan``: validate a user's plan against this agent's registry and run it.

        Args:
            plan_json: The plan, as JSON of this agent's plan type.
            ctx: The call being served.

        Returns:
            The plan's final state when it succeeded.

        Raises:
            protocol.InvalidArgumentError: ``plan_json`` is not JSON or not a plan of this type.
            protocol.FailedPreconditionError: The plan fails validation (a cycle, a tool outside
                this agent's registry, ...); the message names every problem.
            protocol.RemoteError: The plan ran and failed: the subclass of its failure class.
        """
        raw = json_object(plan_json, "the plan")
        result = await self.submit_plan(raw)
        if result.status is not PlanStatus.SUCCEEDED:
            raise self._failure(result)
        return self.record(result.plan.id).snapshot(self.role)

    # --- progress ------------------------------------------------------------------------------

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        """Stream the events of ``plan_id`` and of every plan whose id starts with ``plan_id/``.

        Stored events come first, then live ones. The stream ends after the plan ``plan_id``
        itself reaches a final status on this agent; when that plan is not this agent's, it goes on
        until the consumer stops iterating.

        Args:
            plan_id: The plan; ``""`` streams every plan.

        Yields:
            The events, in the order they happened.
        """
        queue: asyncio.Queue[tuple[int, PlanEvent]] = asyncio.Queue(WATCH_QUEUE_LIMIT)
        self._watchers.add(queue)
        try:
            stored: list[tuple[int, PlanEvent]] = []
            for record in self._records.values():
                if _matches(record.plan.id, plan_id):
                    stored.extend(zip(record._seqs, record.events, strict=True))
            stored.sort(key=lambda item: item[0])
            last = 0
            for seq, event in stored:
                last = seq
                yield event
                if self._ends(event, plan_id):
                    return
            while True:
                seq, event = await queue.get()
                if queue in self._lagging:
                    raise ResourceExhaustedError(
                        f"this Watch stream fell more than {WATCH_QUEUE_LIMIT} events behind and "
                        "was dropped; watch again (stored events are replayed)"
                    )
                if seq <= last or not _matches(event.plan_id, plan_id):
                    continue
                yield event
                if self._ends(event, plan_id):
                    return
        finally:
            self._watchers.discard(queue)
            self._lagging.discard(queue)

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """Snapshots of ``plan_id`` and its sub-plans (``""``: every remembered plan)."""
        return [
            record.snapshot(self.role)
            for record in self._records.values()
            if _matches(record.plan.id, plan_id)
        ]

    def record(self, plan_id: str) -> PlanRecord:
        """The record of one plan.

        Raises:
            protocol.NotFoundError: The agent does not remember that plan.
        """
        try:
            return self._records[plan_id]
        except KeyError:
            raise NotFoundError(f"the {self.role} agent has no plan {plan_id!r}") from None

    # --- durable control -----------------------------------------------------------------------

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
                output = _output_of(request.output_json)
                return await self.decide_gate(
                    request.plan_id,
                    request.gate_id,
                    approve=request.action == "approve",
                    approver=ctx.caller,
                    rationale=request.rationale,
                    revision=request.revision or None,
                    output=output,
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
            protocol.InvalidArgumentError: ``plan_json`` is not a plan of this agent's type.
            protocol.FailedPreconditionError: The plan is running here (pause it first), stopped
                with a step in flight, the agent has no store, or the new plan fails validation.
        """
        await self._ready(plan_id)
        await self._revision_of(plan_id)
        raw = json_object(plan_json, "the plan")
        raw = {**raw, "id": plan_id}
        try:
            new_plan = self.plan_type.model_validate(raw)
        except ValidationError as exc:
            raise _invalid(f"not a valid {self.plan_type.__name__}", exc) from None
        problems = self._problems(new_plan)
        if problems:
            raise FailedPreconditionError(
                _one_line(f"replan of {plan_id!r} refused: " + "; ".join(problems))
            )
        if self._is_active(plan_id):
            raise FailedPreconditionError(
                f"plan {plan_id!r} is running; pause it before replanning"
            )
        try:
            revision = await self._engine.replan(
                plan_id, new_plan, rationale=rationale, author=author
            )
        except (PlanControlError, PlanValidationError) as exc:
            raise FailedPreconditionError(_one_line(str(exc))) from exc
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
        state = await self.store.load(plan_id) if self.store is not None else None
        if self.store is None or state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        records = await self.store.revisions(plan_id)
        listed = [_revision_entry(record) for record in records]
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
        state = await self.store.load(plan_id) if self.store is not None else None
        if self.store is None or state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        try:
            report = await replay_plan(
                self.store, plan_id, plan_type=self.plan_type, outputs=outputs
            )
        except PlanControlError as exc:
            raise FailedPreconditionError(_one_line(str(exc))) from exc
        steps = len(state.plan(self.plan_type).steps)
        return ReplayResult(
            plan_id=plan_id,
            agent=self.role,
            revision=report.revision,
            recorded_status=report.recorded_status.value,
            replayed_status=report.replayed_status.value if report.replayed_status else "",
            # Per step: order, outcomes, status, output; then the plan's status.
            decisions=4 * steps + 1,
            divergences=[
                ReplayDivergence(
                    step_id=d.step_id,
                    decision=d.decision,
                    recorded=d.recorded[:_MESSAGE_LIMIT],
                    replayed=d.replayed[:_MESSAGE_LIMIT],
                )
                for d in report.divergences
            ],
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
    ) -> PlanSnapshot:
        """Approve or reject a gate (a gate step, or a reconcile gate named after its step).

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

        Returns:
            The plan's state after the decision.

        Raises:
            protocol.NotFoundError: No such plan here.
            protocol.FailedPreconditionError: The gate is unknown, not open or already decided,
                the revision is not the plan's, or ``output`` was given for a gate step.
        """
        await self._ready(plan_id)
        current = await self._revision_of(plan_id)
        try:
            await self._engine.decide(
                plan_id,
                gate_id,
                approve=approve,
                approver=approver,
                rationale=rationale,
                revision=current if revision is None else revision,
                output=output,
            )
        except (GateDecisionError, PlanControlError) as exc:
            raise FailedPreconditionError(_one_line(str(exc))) from exc
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

    async def _continue_orphan(self, plan_id: str) -> None:
        """Resume a stored plan that no run here carries on (its runner went with an abandoned
        call, ``plans run`` past its deadline): the decision just recorded then takes effect
        now, not at an unannounced ``resume``. A paused plan stays paused."""
        if self.store is None or self._is_active(plan_id):
            return
        state = await self.store.load(plan_id)
        if state is None or state.status.is_final or state.status is PlanStatus.PAUSED:
            return
        logger.info("agent %s resumes plan %s: its runner is gone", self.role, plan_id)
        self._start_resume(plan_id)
        await self._ready(plan_id)

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
        await self._ready(plan_id)
        await self._revision_of(plan_id)
        try:
            await action(plan_id)
        except PlanControlError as exc:
            raise FailedPreconditionError(_one_line(str(exc))) from exc
        return await self._settled(plan_id)

    async def resume(self, plan_id: str) -> PlanSnapshot:
        """Continue a stored, unfinished plan that is not running (paused, or left by a stop).

        The plan runs on in a background task; the snapshot is its state as it starts.

        Raises:
            protocol.NotFoundError: No such plan in the store (or the agent has no store).
            protocol.FailedPreconditionError: The plan is running already, or finished.
        """
        state = await self.store.load(plan_id) if self.store is not None else None
        if state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        if self._is_active(plan_id):
            raise FailedPreconditionError(f"plan {plan_id!r} is already running")
        if state.status.is_final:
            raise FailedPreconditionError(f"plan {plan_id!r} is already {state.status.value}")
        self._start_resume(plan_id)
        await self._ready(plan_id)
        return await self._settled(plan_id)

    async def resume_unfinished(self) -> list[str]:
        """Reload every unfinished plan from the store and resume each in a background task.

        Called when the agent starts (for an actor, after every restart). A plan that waits at a
        gate waits again for its decision; a paused plan is remembered but stays paused.

        Returns:
            The ids of the plans resumed.
        """
        if self.store is None:
            return []
        resumed: list[str] = []
        for plan_id in await self.store.unfinished():
            if self._is_active(plan_id):
                continue
            state = await self.store.load(plan_id)
            if state is None:
                continue
            self._recall(state.plan(self.plan_type), state)
            if state.status is PlanStatus.PAUSED:
                continue
            self._start_resume(plan_id)
            resumed.append(plan_id)
        if resumed:
            logger.info("agent %s resumed %d unfinished plans", self.role, len(resumed))
        return resumed

    async def aclose(self) -> None:
        """Interrupt the background resumptions (their plans stay resumable) and wait for them."""
        tasks = [task for task in self._tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _ready(self, plan_id: str) -> None:
        """Wait until a background resumption of ``plan_id`` (if any) is live in the engine."""
        task = self._tasks.get(plan_id)
        started = self._started.get(plan_id)
        if task is not None and not task.done() and started is not None:
            await started.wait()

    def _is_active(self, plan_id: str) -> bool:
        task = self._tasks.get(plan_id)
        return plan_id in self._active or (task is not None and not task.done())

    async def _revision_of(self, plan_id: str) -> int:
        """The plan's current revision, from the store or the records (``NotFoundError``)."""
        if self.store is not None:
            state = await self.store.load(plan_id)
            if state is not None:
                if plan_id not in self._records:
                    self._recall(state.plan(self.plan_type), state)
                return state.revision
        return self.record(plan_id).plan.revision

    def _recall(self, plan: Plan, state: PlanState) -> PlanRecord:
        """The record of a stored plan, made (or refreshed) from its state."""
        record = self._records.get(plan.id)
        if record is None or record.plan.revision != plan.revision:
            record = self._remember(PlanRecord(plan=plan))
        record.status = state.status
        for step_id, step in state.steps.items():
            record.steps[step_id] = step.status
        for gate_id, gate in state.gates.items():
            if gate.decision is GateDecision.OPEN:
                record.steps[gate_id] = StepStatus.BLOCKED
        return record

    async def _settled(self, plan_id: str) -> PlanSnapshot:
        """The plan's snapshot once a control action was taken, refreshed from the store when no
        run here reports its events."""
        # Let a run woken by the action take its next step before the snapshot is taken.
        await asyncio.sleep(0)
        if self.store is not None and not self._is_active(plan_id):
            state = await self.store.load(plan_id)
            if state is not None:
                return self._recall(state.plan(self.plan_type), state).snapshot(self.role)
        return self.record(plan_id).snapshot(self.role)

    def _start_resume(self, plan_id: str, capability: str = "") -> asyncio.Task[PlanResult[Any]]:
        task = self._tasks.get(plan_id)
        if task is not None and not task.done():
            return task
        task = asyncio.get_running_loop().create_task(
            self._resume(plan_id, capability), name=f"resume {plan_id}"
        )
        self._tasks[plan_id] = task
        self._started[plan_id] = asyncio.Event()
        task.add_done_callback(self._resumed)
        return task

    def _resumed(self, task: asyncio.Task[PlanResult[Any]]) -> None:
        for plan_id, known in list(self._tasks.items()):
            if known is task:
                del self._tasks[plan_id]
                self._started.pop(plan_id, asyncio.Event()).set()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("agent %s: resuming %s failed: %s", self.role, task.get_name(), exc)

    async def _resume(self, plan_id: str, capability: str) -> PlanResult[Any]:
        assert self.store is not None
        state = await self.store.load(plan_id)
        if state is None:
            raise NotFoundError(f"the {self.role} agent has no stored plan {plan_id!r}")
        record = self._recall(state.plan(self.plan_type), state)
        if capability:
            record.capability = capability
        started = self._started.get(plan_id, asyncio.Event())

        def on_event(event: StepEvent) -> None:
            started.set()
            self._observe(record, event)

        result = await self._engine.resume(plan_id, plan_type=self.plan_type, on_event=on_event)
        record.status = result.status
        record.result = result
        _follow_revision(record, result)
        return result

    # --- internals -----------------------------------------------------------------------------

    def _plan_id_for(self, request: WireModel, ctx: CallContext) -> str:
        if ctx.plan_id and ctx.step_id:
            return f"{ctx.plan_id}/{ctx.step_id}"
        own = getattr(request, "plan_id", "")
        if isinstance(own, str) and own:
            return own
        return f"{self.role}-{uuid.uuid4().hex[:12]}"

    async def _run(self, plan: Plan, capability: str) -> PlanResult[Any]:
        latest = 0
        previous = self._records.get(plan.id)
        if previous is not None:
            latest = previous.plan.revision
        if self.store is not None:
            task = self._tasks.get(plan.id)
            if task is not None and not task.done():
                # A caller retrying after a restart: join the plan resumed from the store.
                return await asyncio.shield(task)
            state = await self.store.load(plan.id)
            if state is not None and not state.status.is_final:
                if state.status is PlanStatus.PAUSED:
                    raise FailedPreconditionError(f"plan {plan.id!r} is paused; resume it first")
                return await asyncio.shield(self._start_resume(plan.id, capability))
            if state is not None:
                latest = max(latest, state.revision)
        if plan.revision <= latest:
            # The same id again (a retried step, a resubmitted plan): a new revision of it.
            plan = plan.model_copy(update={"revision": latest + 1})
        problems = self._problems(plan)
        if problems:
            message = _one_line(f"plan {plan.id!r} refused: " + "; ".join(problems))
            self._refuse(plan, capability, message)
            raise FailedPreconditionError(message)
        record = self._remember(PlanRecord(plan=plan, capability=capability))
        self._active.add(plan.id)
        try:
            result = await self._engine.run(
                plan, on_event=lambda event: self._observe(record, event)
            )
        except PlanControlError as exc:
            raise FailedPreconditionError(_one_line(str(exc))) from exc
        finally:
            self._active.discard(plan.id)
        _follow_revision(record, result)
        return result

    def _problems(self, plan: Plan) -> list[str]:
        """Why this agent may not run ``plan``: another owner, another plan type, a tool it does
        not have or a malformed DAG (empty when it may)."""
        problems: list[str] = []
        if plan.owner != self.role:
            problems.append(f"the plan is owned by {plan.owner!r}, not by the {self.role} agent")
        if not isinstance(plan, self.plan_type):
            problems.append(
                f"the plan is a {type(plan).__name__}; the {self.role} agent runs "
                f"{self.plan_type.__name__} plans"
            )
        try:
            validate_plan(plan, tools=self.registry)
        except PlanValidationError as exc:
            problems.extend(exc.problems)
        return problems

    def _refuse(self, plan: Plan, capability: str, message: str) -> None:
        record = self._remember(PlanRecord(plan=plan, capability=capability))
        record.status = PlanStatus.FAILED
        event = PlanEvent(
            plan_id=plan.id,
            revision=plan.revision,
            status=PlanStatus.FAILED.value,
            failure_class=FailureClass.LOGIC.value,
            message=message[:_MESSAGE_LIMIT],
            timestamp=time.time(),
            agent=self.role,
        )
        self._publish(record, event)
        logger.info("agent %s refused plan %s: %s", self.role, plan.id, message)

    def _remember(self, record: PlanRecord) -> PlanRecord:
        plan_id = record.plan.id
        previous = self._records.pop(plan_id, None)
        if previous is not None:
            # Keep the history of earlier revisions: watchers replay it in order.
            record.events = previous.events + record.events
            record._seqs = previous._seqs + record._seqs
        self._records[plan_id] = record
        while len(self._records) > self._max_records:
            victim = next(
                (pid for pid, r in self._records.items() if r.status in _TERMINAL),
                next(iter(self._records)),
            )
            del self._records[victim]
        return record

    def _observe(self, record: PlanRecord, event: StepEvent) -> None:
        if event.step_id:
            if isinstance(event.status, StepStatus):
                record.steps[event.step_id] = event.status
        elif isinstance(event.status, PlanStatus):
            record.status = event.status
        wire = PlanEvent(
            plan_id=event.plan_id,
            revision=event.revision,
            step_id=event.step_id,
            status=event.status.value,
            attempt=event.attempt,
            failure_class=event.failure_class.value if event.failure_class else "",
            message=event.message[:_MESSAGE_LIMIT],
            timestamp=event.timestamp,
            agent=self.role,
        )
        self._publish(record, wire)

    def _publish(self, record: PlanRecord, event: PlanEvent) -> None:
        seq = next(self._seq)
        record.events.append(event)
        record._seqs.append(seq)
        for queue in list(self._watchers):
            if queue.full():  # a reader this far behind is told so and dropped, never waited for
                self._watchers.discard(queue)
                self._lagging.add(queue)
            else:
                queue.put_nowait((seq, event))

    def _ends(self, event: PlanEvent, plan_id: str) -> bool:
        return (
            bool(plan_id)
            and event.plan_id == plan_id
            and not event.step_id
            and event.status in {status.value for status in _TERMINAL}
        )

    def _failure(self, result: PlanResult[Any]) -> RemoteError:
        plan = result.submitted
        if not result.failures:
            return CancelledError(f"plan {plan.id!r} on the {self.role} agent was cancelled")
        first = result.failures[0]
        message = _one_line(
            f"plan {plan.id!r} step {first.step_id!r} failed "
            f"({first.failure_class.value}): {first.message}"
        )
        return _error_class(first.failure_class)(message)


def serve_in_memory(dispatcher: InMemoryDispatcher, agents: Iterable[Agent]) -> None:
    """Serve every capability of ``agents`` through an in-memory dispatcher.

    Each cross-agent call becomes ``agent.handle(capability, request, ctx)`` with the call context
    the dispatcher sets, so plan ids, deadlines and errors behave as they do behind the gRPC
    server (without authorization, audit or the wire).

    Args:
        dispatcher: The dispatcher the agents were built with.
        agents: The agents to serve.
    """
    for agent in agents:
        for name in agent.capabilities:
            dispatcher.register(agent.role, name, _in_memory_handler(agent, name))


def _in_memory_handler(agent: Agent, capability: str) -> Handler:
    async def handler(request: WireModel) -> WireModel:
        ctx = current_call.get() or CallContext(
            caller="", target=agent.role, capability=capability, request_id=uuid.uuid4().hex
        )
        return await agent.handle(capability, request, ctx)

    return handler
