"""``Agent``, the one agent class of every role: a tool registry, a typed plan, planners, an engine.

An agent serves capabilities. For each request it asks the capability's planner for a plan, checks
the plan against its own registry (a plan may name only this agent's tools, or cross-agent steps),
runs it with the engine, and turns the result into the capability's response. It keeps a record of
its recent plans and their events, which ``watch`` streams and ``plans`` snapshots.

Given a ``planning.StateStore`` its plans are durable and steerable: ``decide_gate``, ``pause``,
``cancel``, ``resume``, ``fork`` (``control`` over the wire), ``resume_unfinished`` after a restart,
``replan``, ``revisions`` and ``replay``. A retried request joins its unfinished plan, or is
answered from the stored outputs of the one that already succeeded (``docs/durability.md``).

The agent comes in parts: this module serves requests (``handle``, ``run_plan``, ``submit_plan``);
``_records.PlanBook`` keeps the records and streams their events; ``_control.PlanControl`` (a
collaborator the agent owns and delegates to, built with a ``ControlDeps``) steers made plans and
resumes them; ``_runs.PlanRuns`` is the one owner of the runs in flight both use; ``_wire``
translates between planning and the protocol, errors included (one table,
``planning.FAILURE_CODES``).

An ``Agent`` is a ``protocol.AgentBackend`` (``protocol.AgentServer`` serves it over gRPC; see
``_in_memory.serve_in_memory``); it raises refusals and failures as ``RemoteError``s (``_wire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from opentelemetry.trace import TracerProvider
from pydantic import ValidationError

from stratagem.agents._admission import (
    plan_problems,
    planner_fields_set,
    ran_for,
    served_before,
    store_refusal,
    stored_result,
    tool_approvals,
)
from stratagem.agents._control import NO_VALUE, ControlDeps, PlanControl
from stratagem.agents._history import PlanHistory
from stratagem.agents._planners import Capabilities, Planner, PlannerReplanner
from stratagem.agents._records import (
    MAX_RECORDS,
    PlanBook,
    PlanRecord,
    follow_revision,
)
from stratagem.agents._runs import PlanRuns
from stratagem.agents._tool import ToolRegistry
from stratagem.agents._wire import (
    caller_deadline,
    coerce_request,
    digest_of_request,
    failure_error,
    goal_marked,
    invalid_argument,
    one_line,
    package_version,
    plan_id_for,
    reason_of,
    run_digest,
    run_failure,
    stored_failure,
    users_run_failure,
)
from stratagem.agents._world import WorldModel, Worlds
from stratagem.planning import (
    ClaimCheck,
    Dispatcher,
    Engine,
    EngineConfig,
    GateNotifier,
    Plan,
    PlanControlError,
    PlanningError,
    PlanResult,
    PlanState,
    PlanStatus,
    StateStore,
    StepError,
    StepEvent,
    StoreError,
)
from stratagem.protocol import (
    AgentCard,
    CallContext,
    CapabilityCard,
    CapabilitySpec,
    ControlRequest,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PlanEvent,
    PlanSnapshot,
    PlansPage,
    PlansQuery,
    Policy,
    ReplayResult,
    RevisionsResponse,
    WireModel,
    json_object,
)

__all__ = ["Agent", "PlanRecord", "Planner", "Prepare"]

Prepare = Callable[["Agent", WireModel], Awaitable[WireModel]]
"""A role's step before serving: given the agent and a request, the request to serve."""

logger = logging.getLogger(__name__)

_ANSWER_BYTES: Final = 1 << 20
"""The message limit a snapshot answered in-process is built for (the server passes its own)."""
_FINAL_STATUSES: Final = frozenset(status.value for status in PlanStatus if status.is_final)


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
        prepare: A role's own step before serving (composed in, not a ``handle`` override): it
            answers the request to serve (the orchestrator's reads A2A skills, applies ``[goals]``).
        worlds: The named worlds its tools share (the perception role's; ``None``: it keeps none).
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
        prepare: Prepare | None = None,
        worlds: Worlds | None = None,
    ) -> None:
        self._role = role
        self._prepare = prepare
        self.worlds = worlds
        """Every world it keeps, by name (``None``: it keeps none)."""
        self.registry = registry
        self.plan_type = plan_type
        self.planner = planner
        self.dispatcher = dispatcher
        self.version = package_version()
        self._capabilities = Capabilities(role, planner)
        self._book = PlanBook(role, max_records)
        self._engine = Engine(
            engine_config,
            tools=registry,
            dispatcher=dispatcher,
            agent=role,
            tracer_provider=tracer_provider,
            store=store,
            replanner=PlannerReplanner(self._book, self._capabilities.planner_of),
            nested_events=self._nested_events,
        )
        self.store = store
        self._runs = PlanRuns(role)
        self._policy: Policy | None = None
        self._control = PlanControl(
            ControlDeps(
                role=role,
                plan_type=plan_type,
                engine=self._engine,
                store=store,
                book=self._book,
                runs=self._runs,
                problems=self._problems,
                policy=lambda: self._policy,
                planner_of=self._capabilities.planner_of,
            )
        )
        self.planning_timeout_s = 0.0
        """The longest planning one request may take (0: no model plans), for a goal's deadline;
        ``runtime`` sets it, and ``model`` (``NAME (TIER)``), with the model planner; cards say."""
        self.model = ""
        self._history = PlanHistory(
            role, plan_type, self._book, store, running=self._runs.is_active
        )

    # --- what the agent is ---------------------------------------------------------------------

    @property
    def role(self) -> str:
        """The agent's role."""
        return self._role

    @property
    def capabilities(self) -> Mapping[str, CapabilitySpec]:
        """The capabilities it serves, by name."""
        return self._capabilities.specs()

    @property
    def world(self) -> WorldModel:
        """The default world (a request that names none acts on it) of an agent that keeps some."""
        if self.worlds is None:
            raise AttributeError(f"the {self.role} agent keeps no world")
        return self.worlds.get()

    def use_planner(self, planner: Planner) -> None:
        """Plan the built-in capabilities with ``planner`` (a model planner, say) from now on;
        extension capabilities keep theirs."""
        self._capabilities.replace_planner(self.planner, planner)
        self.planner = planner

    def use_policy(self, policy: Policy) -> None:
        """Take up what the authorization policy says about this agent's gates: who may decide
        them (its roles; the deciders of gates that name none) and which of its tools need an
        approval before each call (``[[approval]]``, held at a tool gate by the engine). The
        server authorizes the calls themselves; runs started from now on take the approvals.

        Raises:
            ValueError: An approval's ``when`` is not a valid expression (one line naming it).
        """
        approvals = tool_approvals(policy, self.role, self.registry)
        self._policy = policy
        self._engine.approvals = approvals

    @property
    def policy(self) -> Policy | None:
        """The authorization policy it took up (``use_policy``); ``None`` before."""
        return self._policy

    def use_notifier(self, notifier: GateNotifier | None) -> None:
        """Tell ``notifier`` when a gate of this agent's plans opens, escalates or times out
        (runs started from now on)."""
        self._engine.notifier = notifier

    def use_claim_check(self, check: ClaimCheck | None) -> None:
        """Journal tool outputs larger than ``check.max_inline_bytes`` as artifact references
        (``planning.ClaimCheck``; runs started or resumed from now on)."""
        self._engine.claim_check = check

    def add_capability(self, spec: CapabilitySpec, planner: Planner) -> None:
        """Serve another capability (an extension's), planned by ``planner``.

        Args:
            spec: The capability; its ``role`` must be this agent's role, and it must be in the
                protocol's registry (``protocol.register_capability``) so peers can encode it.
            planner: Plans it and builds its response.

        Raises:
            ValueError: The spec is for another role, is not registered, or the name is taken.
        """
        self._capabilities.add(spec, planner)

    def card(self) -> AgentCard:
        """The agent's card: role, version, capabilities with their JSON Schemas, tool names, and
        how it plans (``planner``, ``planning_timeout_s``, ``model``)."""
        return AgentCard(
            role=self.role,
            version=self.version,
            capabilities=[CapabilityCard.from_spec(spec) for spec in self.capabilities.values()],
            tools=self.registry.names(),
            planner="model" if self.planning_timeout_s > 0 else "deterministic",
            planning_timeout_s=self.planning_timeout_s,
            model=self.model,
        )

    # --- serving requests ----------------------------------------------------------------------

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel:
        """Serve one capability request: plan, validate, run, respond.

        The plan's id is ``"<caller plan>/<caller step>"`` when the caller runs a plan, else the
        plan id the call names without a step (an A2A task's id), else the request's own
        ``plan_id`` field when it has a non-empty one, else ``"<role>-<random>"``.

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
        if self._prepare is not None:
            request = await self._prepare(self, request)
        handler = self._capabilities.get(capability)
        if handler is None:
            raise NotFoundError(f"the {self.role} agent does not serve {capability!r}")
        spec, planner = handler
        request = coerce_request(spec, request)
        plan_id = plan_id_for(request, ctx, self.role, served=ctx.capability in self._capabilities)
        # The digest ties a stored plan to the request it serves: without a store, nothing reads it.
        request_digest = "" if self.store is None else digest_of_request(capability, request)
        if self.store is not None:
            state = await served_before(self.store, plan_id, capability, request_digest)
            if state is not None:
                return self._respond_from(state, capability, request, planner)
        try:
            # A model planner's plan is awaited: the agent's loop keeps serving meanwhile.
            made = planner.plan(capability, request, plan_id=plan_id)
            plan = await made if inspect.isawaitable(made) else made
        except (PlanningError, ValueError) as exc:
            message = one_line(f"{capability}: cannot plan {plan_id!r}: {reason_of(exc)}")
            # An id no plan may carry cannot be recorded; the caller still gets the error.
            with contextlib.suppress(ValidationError):
                stub = Plan(id=plan_id, owner=self.role, goal=capability)
                await self._refuse(stub, capability, message)
            if isinstance(exc, StepError):
                raise failure_error(exc.failure_class, message) from exc
            raise FailedPreconditionError(message) from exc
        if self.store is not None:
            plan = plan.model_copy(update={"goal": goal_marked(plan.goal, request_digest)})
        if getattr(request, "detach", False) is True and not ctx.plan_id:
            return await self._detached(plan, capability, spec)
        result = await self._run(plan, capability, caller_deadline(ctx))
        if result.status is not PlanStatus.SUCCEEDED:
            raise run_failure(result, self.role)
        return self._respond(planner, capability, request, result)

    async def _detached(self, plan: Plan, capability: str, spec: CapabilitySpec) -> WireModel:
        """Start ``plan`` for a caller that does not wait (a request with ``detach``): answer
        once it runs (``plan_id``, ``status`` of the capability's response), or with its outcome
        if it ends first. Nobody's deadline binds it; ``cancel`` stops it."""
        run = self._runs.unbound(self._run(plan, capability), plan.id)
        started = asyncio.get_running_loop().create_task(self._book.first_event(plan.id))
        try:
            await asyncio.wait({run, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if run.done():
            result = run.result()
            if result.status is not PlanStatus.SUCCEEDED:
                raise run_failure(result, self.role)
        record = self._book.get(plan.id)
        status = record.status.value if record is not None else PlanStatus.RUNNING.value
        return spec.response.model_validate({"plan_id": plan.id, "status": status})

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

    def _respond_from(
        self, state: PlanState, capability: str, request: WireModel, planner: Planner
    ) -> WireModel:
        """The response of a plan that already succeeded, from its recorded outputs."""
        plan = state.plan(self.plan_type)
        result = stored_result(state, plan)
        record = self._book.recall(plan, state)
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
            protocol.InvalidArgumentError: A mapping that is not a valid plan of this type, or a
                plan that fails validation (for example a step names a tool outside this agent's
                registry, a loop has no bound); the message names every problem.
        """
        typed = self._typed(plan)
        await self._check_users_plan(typed)
        return await self._run(typed, "")

    async def _check_users_plan(self, plan: Plan) -> None:
        """A user's plan that this agent may not run is the caller's bad input: refused as such
        (``InvalidArgumentError`` naming every problem) before anything runs, and kept in the
        history with its reason (``_refuse``)."""
        problems = [*planner_fields_set(plan, self.plan_type), *self._problems(plan)]
        if "/" in plan.id:  # PLAN/STEP is a sub-plan's id: a user's plan must not pass for one
            problems.insert(
                0,
                "its id has a '/', which marks a sub-plan's id (PLAN/STEP): name it without one",
            )
            raise InvalidArgumentError(
                one_line(f"plan {plan.id!r} refused: " + "; ".join(problems))
            )
        if problems:
            message = one_line(f"plan {plan.id!r} refused: " + "; ".join(problems))
            await self._refuse(plan, "", message)
            raise InvalidArgumentError(message)

    async def run_plan(
        self, plan_json: str, ctx: CallContext, *, until_blocked: bool = False
    ) -> PlanSnapshot:
        """Serve ``RunPlan``: validate a user's plan against this agent's registry and run it.

        Without ``until_blocked`` the plan answers its caller as any call's plan does: when the
        caller goes away first, it is cancelled (``Agent._run``). With ``until_blocked`` the
        caller comes back for it (``plans run``): the plan runs in a task of its own, bound by no
        caller's deadline, and ``cancel`` stops it.

        The same request again (its caller and ``request_id``: a client retrying a call it got
        no answer to) runs nothing: the plan is marked with the request (``run_digest``), and a
        retry waits for that plan as the first call would have (until it ends, or waits at a
        gate) and answers as it would have, failure included; after a restart too, from the
        store. Another request with the same plan id is another run of it (a new revision).

        Args:
            plan_json: The plan, as JSON of this agent's plan type.
            ctx: The call being served.
            until_blocked: Answer as soon as the plan waits at a gate (its status ``blocked``),
                not only when it ends; the call's deadline never cancels the plan.

        Returns:
            The plan's state with each step's record: final when it succeeded, ``blocked`` when
            ``until_blocked`` and it waits at a gate.

        Raises:
            protocol.InvalidArgumentError: ``plan_json`` is not JSON or not a plan of this type,
                or the plan fails validation (a cycle, a tool outside this agent's registry, a
                map over something that is not a list, ...); the message names every problem.
            protocol.RemoteError: The plan ran and failed: the subclass of its failure class,
                but ``AbortedError`` for a transient or timeout failure (``users_run_failure``:
                the plan's failure is not the call's).
        """
        raw = json_object(plan_json, "the plan")
        plan = self._typed(raw)
        # Checked first: a plan refused is refused again, whichever request sends it.
        await self._check_users_plan(plan)
        if ctx.request_id:
            mark = run_digest(ctx.caller, ctx.request_id)
            plan = plan.model_copy(update={"goal": goal_marked(plan.goal, mark)})
            if await ran_for(self._book, self.store, plan.id, mark):
                return await self._rejoin(plan, until_blocked=until_blocked)
        if not until_blocked:
            result = await self._run(plan, "", caller_deadline(ctx))
        else:
            run = self._runs.unbound(self._run(plan, ""), plan.id)
            waits = asyncio.get_running_loop().create_task(self._book.blocked(plan.id))
            try:
                await asyncio.wait({run, waits}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waits.cancel()
            if not run.done():
                return await self._answer(plan.id)
            result = run.result()
        if result.status is not PlanStatus.SUCCEEDED:
            raise users_run_failure(result, self.role)
        return await self._answer(result.plan.id)

    async def _rejoin(self, plan: Plan, *, until_blocked: bool) -> PlanSnapshot:
        """Answer a repeated ``RunPlan`` as its first call answers: wait for the plan while it
        runs here (until it ends, or with ``until_blocked`` until it waits at a gate), then its
        snapshot, or the error of its failure. A plan the store holds unfinished and nothing
        runs (this agent restarted) is taken up as ``_run`` takes it up."""
        if not self._runs.is_active(plan.id):
            state = None if self.store is None else await self.store.load(plan.id)
            if state is not None and not state.status.is_final:
                result = await self._run(plan, "")
                if result.status is not PlanStatus.SUCCEEDED:
                    raise users_run_failure(result, self.role)
                return await self._answer(plan.id)
        else:
            async for _ in self._book.watch(plan.id):
                record = self._book.get(plan.id)
                if record is None or not self._runs.is_active(plan.id):
                    break
                status = record.status
                if status.is_final or (until_blocked and status is PlanStatus.BLOCKED):
                    break
        record = self._book.get(plan.id)
        if record is not None and record.result is not None:
            if record.result.status is not PlanStatus.SUCCEEDED:
                raise users_run_failure(record.result, self.role)
            return await self._answer(plan.id)
        state = None if self.store is None else await self.store.load(plan.id)
        if state is not None and state.status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
            raise stored_failure(state, state.plan(self.plan_type), self.role)
        return await self._answer(plan.id)

    async def _answer(self, plan_id: str) -> PlanSnapshot:
        """The plan's snapshot with its steps' records (from the store when there is one)."""
        if self.store is not None:
            with contextlib.suppress(StoreError):
                snapshot = await self._history.snapshot(plan_id, max_bytes=_ANSWER_BYTES)
                if snapshot is not None:
                    return snapshot
        return self._book.record(plan_id).snapshot(self.role)

    def _typed(self, plan: Plan | Mapping[str, Any]) -> Plan:
        if isinstance(plan, Plan):
            return plan
        try:
            return self.plan_type.model_validate(plan)
        except ValidationError as exc:
            raise invalid_argument(f"not a valid {self.plan_type.__name__}", exc) from None

    # --- progress ------------------------------------------------------------------------------

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        """Stream the events of ``plan_id`` and of every plan whose id starts with ``plan_id/``.

        Stored events come first, then live ones. The stream ends after the plan ``plan_id``
        itself reaches a final status on this agent; when that plan is not this agent's, it goes on
        until the consumer stops iterating. A reader that falls more than ``WATCH_QUEUE_LIMIT``
        live events behind gets ``ResourceExhaustedError``.

        Args:
            plan_id: The plan; ``""`` streams every plan.

        Yields:
            The events, in the order they happened.
        """
        # Plans no longer held in memory (this agent restarted): their stored events first.
        for event in await self._history.stored_events(plan_id):
            yield event
            if event.plan_id == plan_id and not event.step_id and _final(event.status):
                return
        async for event in self._book.watch(plan_id):
            yield event

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """Snapshots of ``plan_id`` and its sub-plans (``""``: every remembered plan), from
        memory; ``history`` reads the store."""
        return self._book.plans(plan_id)

    async def history(self, query: PlansQuery, max_bytes: int = _ANSWER_BYTES) -> PlansPage:
        """Serve ``Plans``: one page of this agent's plans from its store (newest first, with
        the query's filters and view), at most ``max_bytes`` of message; without a store, or
        when it cannot be read, the plans held in memory, and the page says so.

        Raises:
            protocol.InvalidArgumentError: ``query.status`` is not a plan status.
        """
        return await self._history.page(query, max_bytes)

    async def prune_history(
        self, *, older_than_s: float | None = None, keep: int | None = None
    ) -> int:
        """Apply a retention to the store: delete finished plans last changed more than
        ``older_than_s`` seconds ago, and those beyond the ``keep`` most recent (unfinished
        plans are kept); how many plan revisions went. Nothing happens without a store.

        Raises:
            planning.StoreError: The store could not be written.
        """
        return await self._history.prune(older_than_s=older_than_s, keep=keep)

    # --- steering made plans: ``PlanControl`` acts (its methods say how) ------------------------

    async def control(self, request: ControlRequest, ctx: CallContext) -> PlanSnapshot:
        """Serve ``Control``: one action on one plan, decided by the verified caller."""
        return await self._control.control(request, ctx)

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
        """Approve or reject a gate of a plan (``value``: omitted, or the value of a gate that
        asks); the plan's state after the decision."""
        return await self._control.decide_gate(
            plan_id,
            gate_id,
            approve=approve,
            approver=approver,
            rationale=rationale,
            revision=revision,
            output=output,
            value=value,
            arguments=arguments,
        )

    async def pause(self, plan_id: str) -> PlanSnapshot:
        """Pause a plan: no new step starts, running ones finish; ``resume`` continues it."""
        return await self._control.pause(plan_id)

    async def cancel(self, plan_id: str) -> PlanSnapshot:
        """Cancel a plan for good: running steps are cancelled, completed ones compensated."""
        return await self._control.cancel(plan_id)

    async def resume(self, plan_id: str) -> PlanSnapshot:
        """Continue a stored, unfinished plan that is not running, in a background task."""
        return await self._control.resume(plan_id)

    async def resume_unfinished(self, *, resume: bool = True) -> list[str]:
        """Take up the store's unfinished plans (at start): resume those that still have a
        reason to run (``resume=False``: none), cancel the others; the ids resumed."""
        return await self._control.resume_unfinished(resume=resume)

    async def replan(
        self, plan_id: str, plan_json: str, *, rationale: str, author: str
    ) -> PlanSnapshot:
        """Make a new revision of a stored plan that is not running here; ``resume`` runs it."""
        return await self._control.replan(plan_id, plan_json, rationale=rationale, author=author)

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
        """Fork a stored plan into a new one that runs on from the fork point, here."""
        return await self._control.fork(
            plan_id,
            at_step=at_step,
            revision=revision,
            outputs=outputs,
            new_plan_id=new_plan_id,
            author=author,
            rationale=rationale,
        )

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """Serve ``Revisions``: the plan's revision history from the store, oldest first."""
        return await self._control.revisions(plan_id)

    async def replay(
        self,
        plan_id: str,
        ctx: CallContext | None = None,
        *,
        outputs: Mapping[str, dict[str, Any]] | None = None,
    ) -> ReplayResult:
        """Serve ``Replay``: re-run a finished plan from its recorded outputs and compare."""
        return await self._control.replay(plan_id, ctx, outputs=outputs)

    def closing(self) -> None:
        """The agent is stopping: a plan whose call is cancelled from now on is interrupted (and
        resumed at the next start), not cancelled as one whose caller went away."""
        self._runs.close()

    async def aclose(self) -> None:
        """Interrupt the runs and background resumptions (their plans stay resumable in the
        store) and wait for them."""
        await self._runs.aclose()

    def record(self, plan_id: str) -> PlanRecord:
        """The record of one plan.

        Raises:
            protocol.NotFoundError: The agent does not remember that plan.
        """
        return self._book.record(plan_id)

    # --- internals -----------------------------------------------------------------------------

    def _nested_events(self, plan: Plan) -> Callable[[StepEvent], None]:
        """The events of a nested plan (a sub-plan, a loop's iteration) go to a record of its
        own, which ``plans`` and ``watch`` of its parent (``parent/...``) show."""
        record = self._book.get(plan.id)
        if record is None or record.plan.revision != plan.revision:
            record = self._book.remember(PlanRecord(plan=plan))
        book = self._book
        return lambda event: book.observe(record, event)

    async def _run(
        self, plan: Plan, capability: str, deadline: float | None = None
    ) -> PlanResult[Any]:
        """Run ``plan`` (or join its run) for a caller waiting until ``deadline`` (wall clock).

        When the caller goes away first (its deadline passed, it cancelled), the plan is cancelled
        for good, not left ``running`` in the store: nobody waits for its answer. Only when the
        agent itself is closing is it an interruption, resumed at the next start.
        """
        if deadline is not None and (plan.deadline is None or deadline < plan.deadline):
            # The caller's, unless the plan's own is sooner (a goal's ``deadline_s``).
            plan = plan.model_copy(update={"deadline": deadline})
        latest = 0
        previous = self._book.get(plan.id)
        if previous is not None:
            latest = previous.plan.revision
        if self._runs.is_serving(plan.id):
            raise FailedPreconditionError(f"plan {plan.id!r} is already running here")
        if self.store is not None:
            task = self._runs.task(plan.id)
            if task is not None:
                # A caller retrying after a restart: join the plan resumed from the store.
                return await asyncio.shield(task)
            state = await self.store.load(plan.id)
            if state is not None and not state.status.is_final:
                if state.status is PlanStatus.PAUSED:
                    raise FailedPreconditionError(f"plan {plan.id!r} is paused; resume it first")
                return await asyncio.shield(self._control.start_resume(plan.id, capability))
            if state is not None:
                latest = max(latest, state.revision)
        if plan.revision <= latest:
            # The same id again (a retried step, a resubmitted plan): a new revision of it.
            plan = plan.model_copy(update={"revision": latest + 1})
        problems = self._problems(plan)
        if problems:
            message = one_line(f"plan {plan.id!r} refused: " + "; ".join(problems))
            await self._refuse(plan, capability, message)
            raise FailedPreconditionError(message)
        record = self._book.remember(PlanRecord(plan=plan, capability=capability))
        with self._runs.serving(plan.id):
            run = asyncio.ensure_future(
                self._engine.run(plan, on_event=lambda event: self._book.observe(record, event))
            )
            try:
                result = await asyncio.shield(run)
            except PlanControlError as exc:
                raise FailedPreconditionError(one_line(str(exc))) from exc
            except asyncio.CancelledError:
                self._caller_gone(plan.id, run, record)
                raise
        follow_revision(record, result)
        record.result = result
        return result

    async def _refuse(self, plan: Plan, capability: str, message: str) -> None:
        """Record a plan refused before it ran, in memory and (durably, with the trace of the
        call that asked for it) in the store, so the history shows it with its reason."""
        self._book.refuse(plan, capability, message)
        if self.store is not None:
            await store_refusal(self.store, plan, message, self.role)

    def _caller_gone(
        self, plan_id: str, run: asyncio.Future[PlanResult[Any]], record: PlanRecord
    ) -> None:
        """The caller of a running plan went away: cancel the plan for good in the background
        (recorded, compensated). Interrupt it instead (resumable) while the agent closes, and
        when it waits at a gate: a person's decision takes it up again."""
        if run.done():
            return
        if self._runs.closing or self.store is None or record.status is PlanStatus.BLOCKED:
            run.cancel()
            return
        logger.info("agent %s cancels plan %s: its caller is gone", self.role, plan_id)
        self._runs.background(
            plan_id,
            lambda _started: self._cancel_abandoned(plan_id, run, record),
            name=f"cancel {plan_id}",
            live=True,
        )

    async def _cancel_abandoned(
        self, plan_id: str, run: asyncio.Future[PlanResult[Any]], record: PlanRecord
    ) -> PlanResult[Any]:
        try:
            await self._engine.cancel(plan_id)
        except PlanControlError:
            pass  # it finished meanwhile
        except BaseException:
            run.cancel()
            raise
        result = await run
        follow_revision(record, result)
        return result

    def _problems(self, plan: Plan) -> list[str]:
        """Why this agent may not run ``plan``: another owner, another plan type, a tool it does
        not have or a malformed DAG (empty when it may)."""
        return plan_problems(plan, role=self.role, plan_type=self.plan_type, registry=self.registry)


def _final(status: str) -> bool:
    return status in _FINAL_STATUSES
