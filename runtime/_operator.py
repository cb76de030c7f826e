"""The operator API: what the ``stratagem`` commands do to a running deployment, from Python.

``Operator`` is async (one event loop: its gRPC channels open on the loop of its first call, and a
call from another loop is ``protocol.ProtocolUsageError``);
``SyncOperator`` (``runtime._operator_sync``) runs it on a loop of its own for scripts. Both are
what the CLI's commands use.

Where the agents are, in this order:

1. ``endpoints`` given to the constructor: those, and nothing else;
2. the endpoints the agents published in ``STATE_DIR/endpoints/<role>.json``, when this machine
   runs the deployment (``stratagem up`` without an address: see ``runtime._local``). The caller
   does not join Ray;
3. otherwise, or when an agent does not answer at its published endpoint, the ``Directory``: by
   default Ray's (``RayDirectory``), which makes this process a Ray driver until ``aclose``.

Errors (what the CLI maps to its exit codes):

* ``InputError`` (exit 2): an unknown agent, capability or plan status, a payload or plan the
  models refuse, a settings value out of range; ``PlanNotFoundError`` when no agent holds a plan;
* ``protocol.MissingSecretError`` (exit 2): token mode and no cluster secret at its path;
* ``protocol.RemoteError`` subclasses (exit 1): the agent refused or failed (``PERMISSION_DENIED``,
  ``FAILED_PRECONDITION``, ``DEADLINE_EXCEEDED``...);
* ``LaunchError`` (exit 1): no deployment found, or an agent not answering;
* other ``protocol.ProtocolError`` (exit 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError
from pydantic_settings import SettingsError

from stratagem.protocol import (
    CAPABILITIES,
    OPERATOR,
    ROLES,
    AgentCard,
    AgentClient,
    CapabilitySpec,
    ClientConfig,
    ControlAction,
    ControlRequest,
    Credentials,
    PlanEvent,
    PlanSnapshot,
    ProtocolUsageError,
    ReplayResult,
    RevisionsResponse,
    SubmitGoalRequest,
    UnavailableError,
    WireModel,
    capability_for,
)
from stratagem.runtime._extensions import deployment_roles
from stratagem.runtime._goal import GoalOutcome, run_goal
from stratagem.runtime._input import (
    InputError,
    PlanNotFoundError,
    check_encoded_size,
    check_plan_steps,
    check_timeout,
    read_mapping,
    unknown_name,
    validation_line,
)
from stratagem.runtime._local import LaunchError, published_endpoint
from stratagem.runtime._security import credentials_for
from stratagem.runtime._settings import Settings, load_settings

__all__ = [
    "Directory",
    "Operator",
    "RayDirectory",
    "capability_spec",
    "check_role",
    "check_status",
    "operator_settings",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

PlanSource = Path | Mapping[str, Any]
"""A plan: a YAML or JSON file, or the mapping such a file holds (id, owner, goal, steps)."""


def operator_settings(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    address: str | None = None,
    profile: str | None = None,
    **more: Any,
) -> Settings:
    """The deployment's settings as the CLI reads them (argument > environment > profile).

    Raises:
        InputError: A value is out of range, or a ``STRATAGEM_*`` value is not the JSON it must be.
    """
    try:
        return load_settings(
            profile=profile,
            address=address,
            state_dir=None if state_dir is None else Path(state_dir),
            **more,
        )
    except ValidationError as exc:
        raise InputError(validation_line("settings", exc)) from exc
    except SettingsError as exc:
        raise InputError(f"invalid settings: {exc}") from exc


def check_role(agent: str, roles: Sequence[str] = ROLES) -> None:
    """Raises ``InputError`` unless ``agent`` names one of ``roles`` (the built-in ones by
    default; ``deployment_roles`` adds those the extensions define)."""
    if agent not in roles:
        raise InputError(unknown_name("agent", agent, roles))


def check_status(status: str) -> None:
    """Raises ``InputError`` unless ``status`` is a plan status (``blocked``, ``succeeded``...)."""
    from stratagem.planning import PlanStatus  # the engine's vocabulary: loaded when asked

    statuses = [value.value for value in PlanStatus]
    if status not in statuses:
        raise InputError(unknown_name("status", status, statuses))


def capability_spec(settings: Settings, agent: str, capability: str) -> CapabilitySpec:
    """``agent``'s ``capability`` (the settings' extensions loaded first: they may add agents and
    capabilities).

    Raises:
        InputError: An unknown agent or capability, or an extension that does not load.
    """
    check_role(agent, deployment_roles(settings.extensions))
    spec = capability_for(agent, capability)
    if spec is None:
        served = [name for name, item in CAPABILITIES.items() if item.role == agent]
        raise InputError(
            f"agent {agent!r} has no capability {capability!r}; valid: {', '.join(served)}"
        )
    return spec


class Directory(Protocol):
    """Where the agents' endpoints come from when their published ones do not serve."""

    async def endpoints(self) -> dict[str, str]:
        """Each deployed role's ``host:port`` (``""`` for one deployed but not answering).

        Raises:
            LaunchError: No deployment is found, or an agent does not answer.
        """
        ...

    async def aclose(self) -> None:
        """Let go of what finding the endpoints took (a Ray connection)."""
        ...


class RayDirectory:
    """The endpoints Ray's directory knows: this process joins Ray on first use (blocking the event
    loop while it connects: Ray's driver belongs on the calling thread, and the published endpoints
    make this path the exception on one machine).

    Args:
        settings: The deployment's settings (its address, namespace and state directory).
        embedded: Start an embedded Ray with the four agents when no deployment runs (what
            ``stratagem request`` and ``plans run`` do); they stop at ``aclose``. Otherwise no
            deployment is ``LaunchError``.
    """

    def __init__(self, settings: Settings, *, embedded: bool = False) -> None:
        self._settings = settings
        self._embedded = embedded
        self._found: dict[str, str] | None = None
        self._stack = contextlib.ExitStack()

    async def endpoints(self) -> dict[str, str]:
        if self._found is None:
            # Ray is imported here only: a caller the published endpoints serve never loads it.
            from stratagem.runtime._launcher import Deployment

            deployment = Deployment(self._settings)
            if self._embedded:
                self._stack.enter_context(deployment.embedded())
            else:
                deployment.connect(allow_embedded=False)
                self._stack.callback(deployment.disconnect)
            self._found = {info.role: info.endpoint for info in deployment.status()}
        return self._found

    async def aclose(self) -> None:
        self._found = None
        self._stack.close()


class Operator:
    """A deployment's agents, as the operator (or ``caller``) sees them.

    Args:
        state_dir: The deployment's state directory (else ``STRATAGEM_STATE_DIR``, the profile's,
            the nearest ``.stratagem`` folder, ``~/.local/state/stratagem``).
        address: A Ray cluster address: endpoints then come from Ray.
        profile: A profile of the config file.
        settings: Settings made already (instead of ``state_dir``, ``address`` and ``profile``).
        caller: The identity calls are made as; its credentials follow ``STRATAGEM_AUTH``.
        timeout_s: The deadline of a call that names none (``request_timeout_s`` when ``None``).
        endpoints: Each role's ``host:port``, used as given (no published files, no Ray).
        directory: Where endpoints come from when the published ones do not serve (Ray's).

    Use ``async with Operator() as op:`` or call ``aclose``.

    Raises:
        InputError: The settings or ``timeout_s`` are out of range.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        address: str | None = None,
        profile: str | None = None,
        settings: Settings | None = None,
        caller: str = OPERATOR,
        timeout_s: float | None = None,
        endpoints: Mapping[str, str] | None = None,
        directory: Directory | None = None,
    ) -> None:
        if settings is not None and (state_dir, address, profile) != (None, None, None):
            raise TypeError("pass settings, or state_dir/address/profile, not both")
        if settings is None:
            settings = operator_settings(state_dir, address=address, profile=profile)
        self.settings = settings
        """The deployment's settings."""
        self.caller = caller
        """The identity calls are made as."""
        self._config = ClientConfig(
            default_timeout_s=check_timeout(timeout_s) or settings.request_timeout_s
        )
        self._fixed = dict(endpoints) if endpoints is not None else None
        self._directory = directory or RayDirectory(settings)
        self._from_directory = False  # once asked, the directory answers for every later call
        self._credentials: Credentials | None = None
        self._credentials_made = False  # on first use: a bad secret fails the call, not the setup
        self._clients: dict[str, AgentClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Operator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every channel, and let go of the directory (a Ray connection)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        await self._directory.aclose()

    # -- finding the agents ----------------------------------------------------------------------

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role: the built-in four, then those the settings' extensions define
        (imported on first use, as the agents import them).

        Raises:
            InputError: An extension does not load, or defines an agent badly.
        """
        return deployment_roles(self.settings.extensions)

    def _check_role(self, agent: str) -> None:
        check_role(agent, self.roles)

    async def endpoints(self, roles: Sequence[str] | None = None) -> dict[str, str]:
        """Each of ``roles``' endpoint (every agent's by default), found as the module docstring
        says."""
        found, _ = await self._endpoints(self.roles if roles is None else roles)
        return found

    async def _endpoints(
        self, roles: Sequence[str], *, published: bool = True
    ) -> tuple[dict[str, str], bool]:
        """``roles``' endpoints, and whether they are the published ones (which may be stale)."""
        if self._fixed is not None:
            missing = [role for role in roles if role not in self._fixed]
            if missing:
                raise LaunchError(f"no endpoint given for {', '.join(missing)}")
            return {role: self._fixed[role] for role in roles}, False
        if published and not self._from_directory:
            found = {role: published_endpoint(self.settings, role) for role in roles}
            if all(found.values()):
                return {role: str(endpoint) for role, endpoint in found.items()}, True
        self._from_directory = True
        everyone = await self._directory.endpoints()
        missing = [role for role in roles if role not in everyone]
        if missing:
            raise LaunchError(f"agents not deployed: {', '.join(missing)}")
        silent = [role for role in roles if not everyone[role]]
        if silent:
            raise LaunchError(
                f"not answering: {', '.join(silent)} (see 'stratagem status' for why)"
            )
        return {role: everyone[role] for role in roles}, False

    def _caller_credentials(self) -> Credentials | None:
        if not self._credentials_made:
            self._credentials = credentials_for(self.settings, self.caller)
            self._credentials_made = True
        return self._credentials

    def _client(self, endpoint: str) -> AgentClient:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:  # its channels would be bound to a loop that may be closed
            raise ProtocolUsageError(
                "an Operator serves the event loop of its first call: make one per loop "
                "(per asyncio.run), or use SyncOperator"
            )
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = AgentClient(
                endpoint,
                caller=self.caller,
                credentials=self._caller_credentials(),
                config=self._config,
            )
        return client

    async def _at(self, role: str, send: Callable[[AgentClient], Awaitable[T]]) -> T:
        """``send`` to ``role``'s agent; asked again through the directory when its published
        endpoint does not answer (``send`` must be safe to repeat: same request id)."""
        endpoints, published = await self._endpoints((role,))
        try:
            return await send(self._client(endpoints[role]))
        except UnavailableError:
            if not published:
                raise
            logger.info("no answer at %s's published endpoint %s: asking Ray", role, endpoints)
        endpoints, _ = await self._endpoints((role,), published=False)
        return await send(self._client(endpoints[role]))

    async def _across(
        self, roles: Sequence[str], send: Callable[[AgentClient], Awaitable[T]]
    ) -> list[tuple[str, T]]:
        """``send`` to each of ``roles``' agents in turn (a read: safe to repeat)."""
        endpoints, published = await self._endpoints(roles)
        try:
            return [(role, await send(self._client(endpoints[role]))) for role in roles]
        except UnavailableError:
            if not published:
                raise
            logger.info("no answer at a published endpoint of %s: asking Ray", endpoints)
        endpoints, _ = await self._endpoints(roles, published=False)
        return [(role, await send(self._client(endpoints[role]))) for role in roles]

    # -- one agent -------------------------------------------------------------------------------

    async def call(
        self,
        agent: str,
        capability: str,
        payload: Mapping[str, Any] | WireModel | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        request_id: str | None = None,
    ) -> WireModel:
        """Ask ``agent`` to serve ``capability`` (what ``stratagem request`` does).

        Args:
            agent: The role called.
            capability: The capability's name, e.g. ``ExtractEntities``.
            payload: Its request: the model, or a mapping validated into it (empty: ``{}``).
            timeout: Seconds to wait.
            request_id: The idempotency key (a fresh one when ``None``): a repeat gets the
                stored answer.

        Returns:
            The capability's response model (e.g. ``protocol.ExtractEntitiesResponse``).

        Raises:
            InputError: An unknown agent or capability, or a payload its model refuses.
        """
        spec = capability_spec(self.settings, agent, capability)
        if isinstance(payload, spec.request):
            body: WireModel = payload
        elif isinstance(payload, WireModel):
            raise InputError(
                f"{capability} takes a {spec.request.__name__}, not a {type(payload).__name__}"
            )
        else:
            try:
                body = spec.request.model_validate(dict(payload or {}))
            except ValidationError as exc:
                raise InputError(validation_line(f"{capability} request", exc)) from exc
        key = request_id or f"op-{uuid.uuid4().hex}"
        return await self._at(
            agent,
            lambda client: client.call(agent, capability, body, request_id=key, timeout=timeout),
        )

    async def health(self, agent: str) -> str:
        """``agent``'s gRPC health status (``SERVING``, ``NOT_SERVING``...).

        Raises:
            protocol.UnavailableError: It does not answer.
        """
        self._check_role(agent)
        return await self._at(agent, lambda client: client.health())

    async def describe(self, agent: str) -> AgentCard:
        """What ``agent`` serves: its capabilities (with their JSON schemas), versions, tools."""
        self._check_role(agent)
        return await self._at(agent, lambda client: client.describe())

    # -- plans -----------------------------------------------------------------------------------

    async def plans(
        self, *, agent: str | None = None, status: str | None = None
    ) -> list[PlanSnapshot]:
        """The plans the agents hold (``agent``'s only; in ``status`` only), by agent and id."""
        if agent is not None:
            self._check_role(agent)
        if status is not None:
            check_status(status)
        roles = self.roles if agent is None else (agent,)
        found = await self._across(roles, lambda client: client.plans(""))
        snapshots = [s for _, got in found for s in got if status is None or s.status == status]
        return sorted(snapshots, key=lambda s: (s.agent, s.plan_id))

    async def show(self, plan_id: str) -> list[PlanSnapshot]:
        """The plan and every sub-plan it caused, from every agent (the owner's first).

        Raises:
            PlanNotFoundError: No agent holds it.
        """
        found = await self._across(self.roles, lambda client: client.plans(plan_id))
        snapshots = [snapshot for _, got in found for snapshot in got]
        if not snapshots:
            raise PlanNotFoundError(plan_id)
        return snapshots

    async def owner(self, plan_id: str) -> str:
        """The role of the agent that holds ``plan_id`` (asked through each agent's ``Plans``).

        Raises:
            PlanNotFoundError: No agent holds it.
        """

        async def holds(client: AgentClient) -> bool:
            return any(snapshot.plan_id == plan_id for snapshot in await client.plans(plan_id))

        for role, held in await self._across(self.roles, holds):
            if held:
                return role
        raise PlanNotFoundError(plan_id)

    async def _on_owner(self, plan_id: str, send: Callable[[AgentClient], Awaitable[T]]) -> T:
        owner = await self.owner(plan_id)
        endpoints, _ = await self._endpoints((owner,))
        return await send(self._client(endpoints[owner]))

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """The plan's revision history on its owner, oldest first."""
        return await self._on_owner(plan_id, lambda client: client.revisions(plan_id))

    async def replay(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> ReplayResult:
        """Re-run a finished plan on its owner from its recorded outputs (no side effects) and
        compare every decision; ``ReplayResult.diverged`` says whether any differs."""
        return await self._on_owner(plan_id, lambda c: c.replay(plan_id, timeout=timeout))

    async def watch(
        self, plan_id: str, *, owner: str | None = None
    ) -> AsyncGenerator[PlanEvent, None]:
        """The events of ``plan_id`` and its sub-plans from its owner (``owner``, when known),
        until the plan ends (a finished plan's stream replays its events and ends)."""
        if owner is None:
            owner = await self.owner(plan_id)
        else:
            self._check_role(owner)
        endpoints, _ = await self._endpoints((owner,))
        async for event in self._client(endpoints[owner]).watch(plan_id):
            yield event

    async def run_plan(
        self,
        plan: PlanSource,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Have the plan's owner validate and run a plan you wrote; returns its final state.

        The plan is checked here first as its owner will (its type, tools, cycles, size).

        Raises:
            InputError: The plan is not one its owner would run (every problem named).
        """
        owner, plan_json = _plan_json(plan, self.settings)
        key = f"run-{uuid.uuid4().hex}"
        return await self._at(
            owner, lambda client: client.run_plan(plan_json, timeout=timeout, request_id=key)
        )

    async def submit(
        self,
        goal: SubmitGoalRequest | Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline for the whole goal)
        on_event: Callable[[PlanEvent], None] | None = None,
    ) -> GoalOutcome:
        """Pursue a story goal across all agents (``goal``, ``passage``, ``beats``); returns the
        orchestrator's answer, every agent's plans (an extension's agents' too) and the trace id.

        Args:
            goal: The goal, or the mapping a goal file holds.
            timeout: The whole goal's deadline.
            on_event: Called with every plan event of every agent while the goal runs.
        """
        if not isinstance(goal, SubmitGoalRequest):
            try:
                goal = SubmitGoalRequest.model_validate(dict(goal))
            except ValidationError as exc:
                raise InputError(validation_line("goal", exc)) from exc
        endpoints = await self.endpoints()
        return await run_goal(
            endpoints,
            goal,
            timeout_s=check_timeout(timeout) or self._config.default_timeout_s,
            on_event=on_event,
            credentials=self._caller_credentials(),
        )

    # -- control ---------------------------------------------------------------------------------

    async def control(
        self,
        plan_id: str,
        action: ControlAction,
        *,
        gate_id: str = "",
        rationale: str = "",
        output: Mapping[str, Any] | None = None,
        plan: PlanSource | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Send one control action to the agent that owns ``plan_id``; the plan's state after it.

        ``approve``, ``reject``, ``pause``, ``cancel``, ``resume`` and ``replan`` below are this
        with their arguments named.

        Raises:
            InputError: The arguments do not make a valid request (e.g. no rationale for a gate).
            PlanNotFoundError: No agent holds the plan.
            protocol.FailedPreconditionError: The action does not apply (a gate not open...).
        """
        plan_json = "" if plan is None else _plan_json(plan, self.settings, plan_id=plan_id)[1]
        recorded = None if output is None else dict(output)
        try:
            ControlRequest(
                plan_id=plan_id,
                action=action,
                gate_id=gate_id,
                rationale=rationale,
                output_json="" if recorded is None else json.dumps(recorded),
                plan_json=plan_json,
            )
        except ValidationError as exc:
            raise InputError(validation_line(f"{action} of plan {plan_id!r}", exc)) from exc
        return await self._on_owner(
            plan_id,
            lambda client: client.control(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                output=recorded,
                plan_json=plan_json,
                timeout=timeout,
            ),
        )

    async def approve(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        output: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Approve a gate: its plan goes on (a reconciled step is re-run, or ``output`` recorded
        as its result when its effect was found done)."""
        return await self.control(
            plan_id, "approve", gate_id=gate_id, rationale=rationale, output=output, timeout=timeout
        )

    async def reject(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Reject a gate: it (or the reconciled step) fails, and so its plan, compensated."""
        return await self.control(
            plan_id, "reject", gate_id=gate_id, rationale=rationale, timeout=timeout
        )

    async def pause(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Pause a plan: no new step starts, running ones finish; ``resume`` continues it."""
        return await self.control(plan_id, "pause", timeout=timeout)

    async def cancel(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Cancel a plan for good: running steps are cancelled, completed ones compensated."""
        return await self.control(plan_id, "cancel", timeout=timeout)

    async def resume(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Resume a stored, unfinished plan that is not running (paused, or left by a stop)."""
        return await self.control(plan_id, "resume", timeout=timeout)

    async def replan(
        self,
        plan_id: str,
        plan: PlanSource,
        rationale: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Make a new revision of a stored plan that is not running (pause it first) from
        ``plan`` (its id replaced by ``plan_id``); ``resume`` runs it."""
        return await self.control(
            plan_id, "replan", rationale=rationale, plan=plan, timeout=timeout
        )


def _plan_json(plan: PlanSource, settings: Settings, *, plan_id: str = "") -> tuple[str, str]:
    """Check a plan the way its owner will: its owner and the plan as JSON of the owner's type.

    ``plan_id``, when given, replaces the plan's id (a new revision of that plan). The agents and
    the planning engine are imported here, not with the module: most calls need neither.
    """
    from stratagem.agents import ExtensionError, build_agent
    from stratagem.planning import PlanValidationError, validate_plan

    where = str(plan) if isinstance(plan, Path) else "the mapping given"
    raw = (
        read_mapping(plan, "a plan's id, owner and steps") if isinstance(plan, Path) else dict(plan)
    )
    check_plan_steps(where, raw)
    if plan_id:
        raw["id"] = plan_id
    owner = raw.get("owner")
    roles = deployment_roles(settings.extensions)
    if owner not in roles:
        raise InputError(f"{where}: owner must be one of {', '.join(roles)}, not {owner!r}")
    try:
        agent = build_agent(owner, extensions=settings.extensions)
    except ExtensionError as exc:
        raise InputError(str(exc)) from exc
    try:
        typed = agent.plan_type.model_validate(raw)
    except ValidationError as exc:
        raise InputError(validation_line(f"plan in {where}", exc)) from exc
    try:
        validate_plan(typed, tools=agent.registry, roles=roles, capabilities=CAPABILITIES)
    except PlanValidationError as exc:
        raise InputError(f"plan {typed.id!r} refused: " + "; ".join(exc.problems)) from exc
    plan_json = typed.model_dump_json()
    check_encoded_size(where, plan_json, settings.max_message_bytes)
    return owner, plan_json
