"""The operator API: what the ``stratagem`` commands do to a running deployment, from Python.

``Operator`` is async (one event loop: its gRPC channels open on the loop of its first call, and a
call from another loop is ``protocol.ProtocolUsageError``);
``SyncOperator`` (``runtime.operator._operator_sync``) runs it on a loop of its own for scripts.
Both are what the CLI's commands use.

Where the agents are, in this order:

1. ``endpoints`` given to the constructor: those, and nothing else;
2. the endpoints the agents published in ``STATE_DIR/endpoints/<role>.json``, when this machine
   runs the deployment (``stratagem up`` without an address: see ``runtime.host._local``), each used
   only once the agent there proved it holds the deployment's key (``protocol.prove_endpoint``;
   before that nothing but a nonce is sent). The caller does not join Ray;
3. otherwise, or when an agent does not answer at its published endpoint, the ``Directory``: by
   default Ray's (``RayDirectory``), which makes this process a Ray driver until ``aclose``.

Errors (what the CLI maps to its exit codes):

* ``InputError`` (exit 2): an unknown agent, capability or plan status, a payload or plan the
  models refuse, a settings value out of range, a ``caller`` the operator may not be (an agent's
  identity: see ``runtime.config._security``); ``PlanNotFoundError`` when no agent holds a plan;
* ``protocol.MissingSecretError`` (exit 2): token mode and no cluster secret at its path;
* ``protocol.RemoteError`` subclasses (exit 1): the agent refused or failed (``PERMISSION_DENIED``,
  ``FAILED_PRECONDITION``, ``DEADLINE_EXCEEDED``...);
* ``LaunchError`` (exit 1): no deployment found, or an agent not answering;
* ``protocol.UnavailableError`` (exit 1): an agent at its published endpoint does not answer;
* other ``protocol.ProtocolError`` (exit 1).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from pydantic import ValidationError
from pydantic_settings import SettingsError

from stratagem.protocol import (
    CAPABILITIES,
    MAX_PLANS_PAGE,
    MCP_SERVER_NAME_PATTERN,
    OPERATOR,
    ROLES,
    WORLD_PATTERN,
    AgentCard,
    AgentClient,
    CapabilitySpec,
    ClientConfig,
    ControlAction,
    ControlRequest,
    Credentials,
    InvalidArgumentError,
    ListWorldsResponse,
    PlanEvent,
    PlanSnapshot,
    PlansQuery,
    PlansView,
    ProtocolError,
    ProtocolUsageError,
    RemoteError,
    ReplayResult,
    ResetWorldResponse,
    RevisionsResponse,
    ShowWorldResponse,
    SubmitGoalRequest,
    UnavailableError,
    UntrustedEndpointError,
    WireModel,
    capability_for,
    prove_endpoint,
)
from stratagem.runtime.config._errors import LaunchError
from stratagem.runtime.config._extensions import settings_roles
from stratagem.runtime.config._lazy import load
from stratagem.runtime.config._published import published_endpoint
from stratagem.runtime.config._security import (
    IdentityRefusedError,
    check_operator_identity,
    credentials_for,
)
from stratagem.runtime.config._settings import Settings, load_settings
from stratagem.runtime.config._statedir import StateDirError
from stratagem.runtime.operator._goal import (
    GoalOutcome,
    GoalStarted,
    goal_deadline_s,
    root_span,
    run_goal,
    start_goal,
)
from stratagem.runtime.operator._history import (
    DEFAULT_HISTORY_PAGE,
    HistoryFilter,
    HistoryPage,
    PlanHistory,
    PlanView,
    TraceSummary,
    check_plan_id,
    decode_page_token,
    encode_page_token,
    plan_history,
    plan_view,
    trace_summaries,
)
from stratagem.runtime.operator._input import (
    MAX_TIMEOUT_S,
    InputError,
    PlanNotFoundError,
    check_encoded_size,
    check_plan_steps,
    check_timeout,
    read_mapping,
    unknown_name,
    validation_line,
)
from stratagem.runtime.operator._research import research

if TYPE_CHECKING:
    from stratagem.planning import Plan

__all__ = [
    "Directory",
    "Operator",
    "capability_spec",
    "check_role",
    "check_status",
    "operator_settings",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_FINAL = frozenset({"succeeded", "failed", "cancelled"})
"""The plan statuses that end it (``planning.PlanStatus.is_final``; not imported here)."""
_FIRST_SCAN = 1
"""A page of top-level plans first asks the agents for this many plans per plan wanted; then
for as many as the plans scanned so far held per top-level plan (10 for a demo goal)."""

_DRAIN_S = 0.25
"""How long ``watch`` takes sub-plans' last events after the plan itself ended."""

_NO_VALUE: Any = object()
"""``approve``'s ``value`` when none is given (``None`` is JSON's null)."""
_PROOF_TIMEOUT_S = 10.0
"""The longest an agent at a published endpoint is given to prove its key (it answers in
milliseconds unless stopped)."""

PlanSource = Path | Mapping[str, Any]
"""A plan: a YAML or JSON file, or the mapping such a file holds (id, owner, goal, steps)."""

_MCP_TOOL: Final = re.compile(rf"{MCP_SERVER_NAME_PATTERN}\..+")
"""How an agent's registry names an MCP server's tool: ``<server>.<tool>``."""


def operator_settings(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    address: str | None = None,
    profile: str | None = None,
    **more: Any,
) -> Settings:
    """The deployment's settings as the CLI reads them (argument > environment > profile).

    Raises:
        InputError: A value is out of range, a ``STRATAGEM_*`` value is not the JSON it must be,
            or the state directory is not this user's alone.
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
    except StateDirError as exc:
        raise InputError(str(exc)) from exc
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
    check_role(agent, settings_roles(settings))
    spec = capability_for(agent, capability)
    if spec is None:
        served = [name for name, item in CAPABILITIES.items() if item.role == agent]
        raise InputError(
            f"agent {agent!r} has no capability {capability!r}; valid: {', '.join(served)}"
        )
    return spec


def _moment(value: datetime | float | None) -> datetime | None:
    """A time bound as an aware datetime (epoch seconds are UTC; a naive datetime is local)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.astimezone()
    return datetime.fromtimestamp(value, UTC)


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


RAY_DIRECTORY: Final = "stratagem.runtime.host._ray_directory:RayDirectory"
"""The default ``Directory``: Ray's, in ``host`` (which this package may not import: it is loaded,
with Ray, only when the published endpoints do not suffice)."""


def ray_directory(settings: Settings, **options: Any) -> Directory:
    """Ray's directory of ``settings``' deployment (``host._ray_directory.RayDirectory``, whose
    keyword ``options`` are ``embedded``, ``embedded_hint`` and ``timeout_s``); importing it
    loads Ray."""
    directory: Directory = load(RAY_DIRECTORY)(settings, **options)
    return directory


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
        if caller != OPERATOR:
            try:
                check_operator_identity(settings, caller, self.roles)
            except IdentityRefusedError as exc:
                raise InputError(str(exc)) from exc
        self._config = ClientConfig(
            default_timeout_s=check_timeout(timeout_s) or settings.request_timeout_s
        )
        self._timeout_given = timeout_s is not None
        self._fixed = dict(endpoints) if endpoints is not None else None
        self._directory = directory or ray_directory(settings)
        self._from_directory = False  # once asked, the directory answers for every later call
        self._credentials: Credentials | None = None
        self._credentials_made = False  # on first use: a bad secret fails the call, not the setup
        self._clients: dict[str, AgentClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proven: set[tuple[str, str]] = set()  # (role, endpoint) that proved the key

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
        return settings_roles(self.settings)

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
                chosen = {role: str(endpoint) for role, endpoint in found.items()}
                if await self._proved(chosen):
                    return chosen, True
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

    async def _proved(self, endpoints: Mapping[str, str]) -> bool:
        """Whether every agent at a published endpoint proved it holds the deployment's key
        (checked once per endpoint); one that cannot is logged and the directory asked instead.

        Raises:
            UnavailableError: An agent does not answer there (stopped, or its loop blocked).
        """
        credentials = self._caller_credentials()
        # Half the call's deadline at most: a stopped agent is named before the deadline passes.
        timeout = min(_PROOF_TIMEOUT_S, self._config.default_timeout_s / 2)
        for role, endpoint in endpoints.items():
            if (role, endpoint) in self._proven:
                continue
            try:
                await prove_endpoint(endpoint, role, credentials, timeout_s=timeout)
            except UntrustedEndpointError as exc:
                logger.warning("%s; asking the directory", exc)
                return False
            self._proven.add((role, endpoint))
        return True

    def _caller_credentials(self) -> Credentials | None:
        if not self._credentials_made:
            try:
                self._credentials = credentials_for(self.settings, self.caller)
            except IdentityRefusedError as exc:  # a key of another identity: the caller's input
                raise InputError(str(exc)) from exc
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

    async def history(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        goal: str | None = None,
        text: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        trace_id: str | None = None,
        plan_id: str | None = None,
        page_size: int = DEFAULT_HISTORY_PAGE,
        page_token: str = "",
        top_level: bool = False,
    ) -> HistoryPage:
        """One page of the deployment's plans, newest first, from every agent's durable store
        (whatever the agents hold in memory, across restarts): the history API.

        Args:
            agent: Only this agent's plans (a role).
            status: Only plans in this status (``running``, ``blocked``, ``failed``...).
            goal: Only plans whose goal contains this text (case-insensitive).
            text: Only plans whose id, goal, steps, outputs or messages contain this text.
            since: Only plans created at or after this time (a datetime or epoch seconds).
            until: Only plans created before this time.
            trace_id: Only plans of this trace.
            plan_id: Only this plan and its sub-plans.
            page_size: At most this many plans (1 to 1000).
            page_token: ``""`` for the first page, else the previous page's
                ``next_page_token`` (made for the same filters).
            top_level: Only plans that are no other plan's sub-plan (a goal's plan, a plan run
                by hand: no ``/`` in the id), each with how many sub-plans it caused
                (``HistoryPage.sub_plans``, counted on every agent).

        Returns:
            The page: plan summaries, the next page's token, and what an agent could not read
            (an agent that does not answer is named there; the others' plans are listed).

        Raises:
            InputError: A filter, page size or page token that is malformed or unknown (an
                unknown agent or status, a malformed trace or plan id, a range that ends before
                it starts, a token made for other filters).
        """
        query = self._history_filter(
            agent=agent,
            status=status,
            goal=goal,
            text=text,
            since=since,
            until=until,
            trace_id=trace_id,
            plan_id=plan_id,
        )
        if not 1 <= page_size <= MAX_PLANS_PAGE:
            raise InputError(f"page size must be from 1 to {MAX_PLANS_PAGE}, not {page_size}")
        cursors = decode_page_token(page_token, query)
        if not top_level:
            views, cursors, unreadable = await self._history_round(query, page_size, cursors)
            return HistoryPage(
                plans=views,
                next_page_token=encode_page_token(query, cursors),
                unreadable=unreadable,
            )
        # Rounds until the page holds page_size top-level plans or nothing is left; the plans
        # scanned on the way are the sub-plans folded under them.
        started_at_top = not page_token and query.until is None
        roots: list[PlanView] = []
        seen: list[PlanView] = []
        unreadable = []
        while len(roots) < page_size:
            need = page_size - len(roots)
            per_root = len(seen) / len(roots) if roots else (_FIRST_SCAN if not seen else 10)
            ask = min(MAX_PLANS_PAGE, max(need, math.ceil(need * per_root * 1.2)))
            views, cursors, problems = await self._history_round(
                query, ask, cursors, roots=page_size - len(roots)
            )
            unreadable.extend(problems)
            seen.extend(views)
            roots.extend(view for view in views if "/" not in view.plan_id)
            if not views or all(cursor is None for cursor in cursors.values()):
                break
        counts = await self._sub_plan_counts(roots, seen, exact_from_scan=started_at_top)
        return HistoryPage(
            plans=roots,
            next_page_token=encode_page_token(query, cursors),
            unreadable=unreadable,
            sub_plans=counts,
        )

    async def _history_round(
        self,
        query: HistoryFilter,
        page_size: int,
        cursors: dict[str, str | None],
        *,
        roots: int = 0,
    ) -> tuple[list[PlanView], dict[str, str | None], list[str]]:
        """One merged page of every agent's history after ``cursors``: the plans (at most
        ``page_size``; with ``roots``, cut after that many top-level ones), each agent's cursor
        after them, and what could not be read."""
        roles = (query.agent,) if query.agent else self.roles
        asked = [role for role in roles if role not in cursors or cursors[role] is not None]
        wire = self._plans_query(query, page_size=page_size, view="summary")
        found, unreadable = await self._each(
            asked,
            lambda role, client: client.history(
                wire.model_copy(update={"page_token": cursors.get(role) or ""})
            ),
        )
        # Each agent's order: newest first, or for a plan and its sub-plans the order they were
        # made (the plan first); the merge keeps it, so each agent's part is a prefix of its page.
        way = 1 if query.plan_id else -1
        merged = sorted(
            ((role, snapshot) for role, page in found for snapshot in page.plans),
            key=lambda item: (way * item[1].created, item[1].agent, item[1].plan_id),
        )
        taken = merged[:page_size]
        if roots:
            tops = [i for i, (_, snapshot) in enumerate(taken) if "/" not in snapshot.plan_id]
            if len(tops) >= roots:  # cut after the last top-level plan wanted
                taken = taken[: tops[roots - 1] + 1]
        next_cursors: dict[str, str | None] = {role: cursors[role] for role in cursors}
        for role, page in found:
            mine = [snapshot for owner, snapshot in taken if owner == role]
            unreadable.extend(f"{role}: {line}" for line in page.unreadable)
            if len(mine) == len(page.plans):  # everything it sent was taken
                next_cursors[role] = page.next_page_token or None
            elif mine:
                next_cursors[role] = mine[-1].cursor
            else:
                next_cursors[role] = cursors.get(role) or ""
        for role in asked:
            next_cursors.setdefault(role, cursors.get(role) or "")
        return [plan_view(snapshot) for _, snapshot in taken], next_cursors, unreadable

    async def _sub_plan_counts(
        self, roots: Sequence[PlanView], seen: Sequence[PlanView], *, exact_from_scan: bool
    ) -> dict[str, int]:
        """How many sub-plans each of ``roots`` caused. A sub-plan is made after its plan and,
        once the plan ended, never again: a scan from the newest plan saw them all, and so did
        any scan for a plan that ended before the newest plan scanned was made; the others are
        asked for (their sub-plans, on every agent)."""
        counts = {root.plan_id: 0 for root in roots}
        for view in seen:
            top = view.plan_id.split("/", 1)[0]
            if top != view.plan_id and top in counts:
                counts[top] += 1
        if exact_from_scan or not seen:
            return counts
        newest = max((view.created for view in seen if view.created is not None), default=None)
        unsure = [
            root.plan_id
            for root in roots
            if root.status not in _FINAL
            or root.updated is None
            or newest is None
            or root.updated >= newest
        ]

        async def count(plan_id: str) -> tuple[str, int]:
            query = PlansQuery(plan_id=plan_id, page_size=MAX_PLANS_PAGE, view="summary")
            snapshots, _ = await self._every_page(self.roles, query)
            return plan_id, sum(1 for s in snapshots if s.plan_id != plan_id)

        counts.update(await asyncio.gather(*(count(plan_id) for plan_id in unsure)))
        return counts

    async def plan(self, plan_id: str, *, full: bool = False) -> PlanHistory:
        """One plan and every sub-plan it caused, from every agent's store: what each step did
        (input, output, error, attempts, timing, revision, author), and for a failed plan the one
        line naming where it went wrong (what ``plans show`` prints).

        Args:
            plan_id: The plan.
            full: Step values whole, as far as the message limit allows (else long values are
                cut, and the step says so).

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        check_plan_id(plan_id)
        query = PlansQuery(plan_id=plan_id, view="steps", full=full)
        snapshots, unreadable = await self._every_page(self.roles, query)
        if not snapshots:
            raise PlanNotFoundError(plan_id)
        return plan_history(plan_id, [plan_view(s) for s in snapshots], unreadable)

    async def traces(self, *, limit: int = 20) -> list[TraceSummary]:
        """The most recent traces (newest first), each with the plans that ran in it, read from
        the agents' histories (what ``stratagem trace`` with no id lists)."""
        if not 1 <= limit <= MAX_PLANS_PAGE:
            raise InputError(f"limit must be from 1 to {MAX_PLANS_PAGE}, not {limit}")
        views: list[PlanView] = []
        token = ""
        # Newest first: a trace's first plan comes after its sub-plans, so read past the limit.
        for _ in range(10):
            page = await self.history(page_size=MAX_PLANS_PAGE // 5, page_token=token)
            views.extend(page.plans)
            token = page.next_page_token
            if not token or len({v.trace_id for v in views if v.trace_id}) > limit:
                break
        return trace_summaries(views, limit)

    async def plans(self, *, agent: str | None = None, status: str | None = None) -> list[PlanView]:
        """Every plan in the agents' stores (``agent``'s only; in ``status`` only), by agent and
        id: every page of ``history``."""
        views: list[PlanView] = []
        token = ""
        while True:
            page = await self.history(
                agent=agent, status=status, page_size=MAX_PLANS_PAGE, page_token=token
            )
            views.extend(page.plans)
            token = page.next_page_token
            if not token:
                return sorted(views, key=lambda v: (v.agent, v.plan_id))

    async def show(self, plan_id: str) -> list[PlanView]:
        """The plan and every sub-plan it caused, from every agent (the owner's first): the
        ``plans`` of ``plan(plan_id)``.

        Raises:
            PlanNotFoundError: No agent holds it.
        """
        return (await self.plan(plan_id)).plans

    async def owner(self, plan_id: str) -> str:
        """The role of the agent that holds ``plan_id`` (asked through each agent's ``Plans``).

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        check_plan_id(plan_id)
        query = PlansQuery(plan_id=plan_id, page_size=1, view="summary")

        async def holds(client: AgentClient) -> bool:
            page = await client.history(query)
            return any(snapshot.plan_id == plan_id for snapshot in page.plans)

        for role, held in await self._across(self.roles, holds):
            if held:
                return role
        raise PlanNotFoundError(plan_id)

    def _history_filter(
        self,
        *,
        agent: str | None,
        status: str | None,
        goal: str | None,
        text: str | None,
        since: datetime | float | None,
        until: datetime | float | None,
        trace_id: str | None,
        plan_id: str | None,
    ) -> HistoryFilter:
        if agent is not None:
            self._check_role(agent)
        if status is not None:
            check_status(status)
        try:
            query = HistoryFilter(
                agent=agent or "",
                status=status or "",
                goal=goal or "",
                text=text or "",
                since=_moment(since),
                until=_moment(until),
                trace_id=trace_id or "",
                plan_id=plan_id or "",
            )
        except ValidationError as exc:
            raise InputError(validation_line("history filter", exc)) from exc
        query.check()
        return query

    @staticmethod
    def _plans_query(query: HistoryFilter, *, page_size: int, view: PlansView) -> PlansQuery:
        since, until = query.seconds()
        return PlansQuery(
            plan_id=query.plan_id,
            page_size=page_size,
            status=query.status,
            goal=query.goal,
            text=query.text,
            since=since,
            until=until,
            trace_id=query.trace_id,
            view=view,
        )

    async def _each(
        self, roles: Sequence[str], send: Callable[[str, AgentClient], Awaitable[T]]
    ) -> tuple[list[tuple[str, T]], list[str]]:
        """``send`` to each of ``roles``' agents; an agent that cannot answer is named in the
        second list (one line each) and the others' answers are kept. A refused request
        (``InvalidArgumentError``) is raised: it is the caller's."""
        found: list[tuple[str, T]] = []
        unreadable: list[str] = []
        endpoints, published = await self._endpoints(roles)
        for role in roles:
            try:
                try:
                    found.append((role, await send(role, self._client(endpoints[role]))))
                except UnavailableError:
                    if not published:
                        raise
                    logger.info("no answer at %s's published endpoint: asking Ray", role)
                    fresh, _ = await self._endpoints((role,), published=False)
                    found.append((role, await send(role, self._client(fresh[role]))))
            except InvalidArgumentError:
                raise
            except (RemoteError, LaunchError) as exc:
                unreadable.append(f"{role}: {exc}")
        return found, unreadable

    async def _every_page(
        self, roles: Sequence[str], query: PlansQuery
    ) -> tuple[list[PlanSnapshot], list[str]]:
        """Every page of ``query`` from each of ``roles``, and what could not be read."""

        async def pages(role: str, client: AgentClient) -> tuple[list[PlanSnapshot], list[str]]:
            snapshots: list[PlanSnapshot] = []
            problems: list[str] = []
            token = ""
            while True:
                page = await client.history(query.model_copy(update={"page_token": token}))
                snapshots.extend(page.plans)
                problems.extend(f"{role}: {line}" for line in page.unreadable)
                token = page.next_page_token
                if not token:
                    return snapshots, problems

        found, unreadable = await self._each(roles, pages)
        snapshots = [snapshot for _, (got, _) in found for snapshot in got]
        unreadable.extend(line for _, (_, problems) in found for line in problems)
        return snapshots, unreadable

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
        self,
        plan_id: str,
        *,
        owner: str | None = None,
        sub_plans: bool = True,
        wait_s: float = 0.0,
    ) -> AsyncGenerator[PlanEvent, None]:
        """The events of ``plan_id`` and of every sub-plan it causes, on its owner and (with
        ``sub_plans``) on every other agent, as they happen, until the plan ends. Stored events
        come first: a finished plan's are replayed, and the stream ends.

        Args:
            plan_id: The plan.
            owner: Its agent, when known (else asked of every agent).
            sub_plans: Follow its sub-plans on the other agents too.
            wait_s: How long to wait for a plan no agent holds yet (one about to be submitted);
                0 does not wait.

        Raises:
            InputError: A malformed plan id, or ``wait_s`` out of range.
            PlanNotFoundError: No agent holds the plan (within ``wait_s``).
        """
        check_plan_id(plan_id)
        if owner is None:
            owner = await self._wait_for_owner(plan_id, wait_s)
        else:
            self._check_role(owner)
        others = [role for role in self.roles if role != owner] if sub_plans else []
        endpoints, _ = await self._endpoints((owner, *others))
        if not others:
            async for event in self._client(endpoints[owner]).watch(plan_id):
                yield event
            return
        queue: asyncio.Queue[tuple[str, PlanEvent | BaseException | None]] = asyncio.Queue()

        async def pump(role: str) -> None:
            try:
                async for event in self._client(endpoints[role]).watch(plan_id):
                    queue.put_nowait((role, event))
            except (ProtocolError, asyncio.CancelledError) as exc:
                if role == owner and not isinstance(exc, asyncio.CancelledError):
                    queue.put_nowait((role, exc))
                    return
                if isinstance(exc, asyncio.CancelledError):
                    raise
            queue.put_nowait((role, None))

        tasks = [asyncio.create_task(pump(role)) for role in (owner, *others)]
        final: PlanEvent | None = None
        try:
            while True:
                role, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    if role == owner:
                        break
                    continue
                if role == owner and item.plan_id == plan_id and not item.step_id:
                    if item.status in _FINAL:
                        final = item  # the plan's end comes last, after its sub-plans'
                        continue
                    if final is not None:  # a final status, then more: a replan went on
                        yield final
                        final = None
                yield item
            # The owner's stream ended with the plan; sub-plans' last events on the other
            # agents' streams may still be on their way: take what arrives within a moment.
            while True:
                try:
                    role, item = await asyncio.wait_for(queue.get(), _DRAIN_S)
                except TimeoutError:
                    break
                if isinstance(item, PlanEvent):
                    yield item
            if final is not None:
                yield final
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_for_owner(self, plan_id: str, wait_s: float) -> str:
        """The owner of ``plan_id``, asked again until it exists or ``wait_s`` passed."""
        if not 0 <= wait_s <= MAX_TIMEOUT_S or wait_s != wait_s:
            raise InputError(f"wait must be from 0 to {MAX_TIMEOUT_S:g} seconds, not {wait_s!r}")
        deadline = time.monotonic() + wait_s
        delay = 0.1
        while True:
            try:
                return await self.owner(plan_id)
            except PlanNotFoundError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)

    async def run_plan(
        self,
        plan: PlanSource,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
        until_blocked: bool = False,
    ) -> PlanView:
        """Have the plan's owner validate and run a plan you wrote; returns its final state.

        With ``until_blocked`` (what ``stratagem plans run`` does) it returns as soon as the plan
        waits at a gate (``status`` ``blocked``; ``approve`` lets it go on), and the deadline
        never cancels the plan: past it the call fails with ``DeadlineExceededError`` and the plan
        runs on at its owner. Without it, a plan whose call ends first is cancelled unless it
        waits at a gate.

        The plan is checked here first as its owner will (its type, tools, cycles, size).

        Raises:
            InputError: The plan is not one its owner would run (every problem named).
            protocol.RemoteError: The plan ran and failed (``AbortedError`` for a transient or
                timeout failure); a request the agent's published endpoint did not answer is sent
                again with the same request id, which runs nothing twice.
        """
        owner, plan_json = await self._checked_plan(plan)
        key = f"run-{uuid.uuid4().hex}"
        plan_id = str(json.loads(plan_json).get("id", ""))
        # The run's trace starts here, so a failure names it too (RemoteError.trace_id).
        with root_span(f"run plan {plan_id}", {"stratagem.plan.id": plan_id}):
            snapshot = await self._at(
                owner,
                lambda client: client.run_plan(
                    plan_json, timeout=timeout, request_id=key, until_blocked=until_blocked
                ),
            )
        return plan_view(snapshot)

    research = research  # a method in its own module (operator/_research.py)

    async def _checked_plan(self, plan: PlanSource, *, plan_id: str = "") -> tuple[str, str]:
        """``plan`` checked as its owner will check it: its owner and the plan as JSON.

        Everything is checked here before any call but the tools an agent built here does not
        have: those named as an MCP server's (``server.tool``), which only the running owner has,
        are looked up in its Describe.
        """
        from stratagem.planning import ToolStep

        where, raw = _read_plan(plan, plan_id=plan_id)
        owner, typed, local = _typed_plan(where, raw, self.settings)
        named = {step.tool for step in typed.steps if isinstance(step, ToolStep)} | {
            step.compensate for step in typed.steps if step.compensate is not None
        }
        served: list[str] = []
        if any(_MCP_TOOL.fullmatch(name) for name in named - set(local)):
            served = (await self.describe(owner)).tools
        return owner, _plan_json(where, typed, [*local, *served], self.settings)

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
            timeout: The whole goal's deadline; by default (and when the operator was made
                without ``timeout_s``) one that fits the deployment's planners:
                ``STRATAGEM_REQUEST_TIMEOUT_S`` plus the planning limits each agent's card states
                for the requests a goal makes it plan (``goal_deadline_s``).

        Raises:
            InputError: The goal is not valid, or the orchestrator refused it as such
                (``INVALID_ARGUMENT``: it consults an external agent the orchestrator does not
                know, ...), before anything ran.
            protocol.DeadlineExceededError: The deadline passed; the message says where the goal
                was waiting and how to give it longer.
        """
        if not isinstance(goal, SubmitGoalRequest):
            try:
                goal = SubmitGoalRequest.model_validate(dict(goal))
            except ValidationError as exc:
                raise InputError(validation_line("goal", exc)) from exc
        endpoints = await self.endpoints()
        timeout_s = check_timeout(timeout)
        if timeout_s is None and not self._timeout_given:
            timeout_s = goal_deadline_s(
                self.settings.request_timeout_s, await self._cards(endpoints), goal
            )
        try:
            return await run_goal(
                endpoints,
                goal,
                timeout_s=timeout_s or self._config.default_timeout_s,
                on_event=on_event,
                credentials=self._caller_credentials(),
            )
        except InvalidArgumentError as exc:
            raise InputError(f"goal refused: {exc.message}") from exc

    async def start(
        self,
        goal: SubmitGoalRequest | Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline for the whole goal)
    ) -> GoalStarted:
        """Start a story goal and return as soon as the orchestrator runs it (what ``submit
        --detach`` does): its plan id and trace id. The goal runs on without this caller;
        ``watch``, ``plan`` and ``history`` follow it.

        Raises:
            InputError: A goal its model refuses.
            protocol.RemoteError: The orchestrator refused the goal before it started.
        """
        if not isinstance(goal, SubmitGoalRequest):
            try:
                goal = SubmitGoalRequest.model_validate(dict(goal))
            except ValidationError as exc:
                raise InputError(validation_line("goal", exc)) from exc
        endpoints = await self.endpoints(("orchestrator",))
        return await start_goal(
            endpoints["orchestrator"],
            goal,
            timeout_s=check_timeout(timeout) or self._config.default_timeout_s,
            credentials=self._caller_credentials(),
        )

    async def _cards(self, endpoints: Mapping[str, str]) -> dict[str, AgentCard]:
        """Each agent's card, as far as it answers within a few seconds (a goal's deadline then
        follows how the agents plan)."""

        async def card(role: str) -> tuple[str, AgentCard | None]:
            try:
                return role, await self._client(endpoints[role]).describe(timeout=5.0)
            except ProtocolError:
                return role, None

        found = await asyncio.gather(*(card(role) for role in endpoints))
        return {role: got for role, got in found if got is not None}

    # -- worlds ----------------------------------------------------------------------------------

    async def worlds(self, *, prefix: str = "") -> ListWorldsResponse:
        """The perception agent's worlds (those whose name starts with ``prefix``), by name, with
        their versions and sizes."""
        answer = await self.call("perception", "ListWorlds", {"prefix": prefix})
        assert isinstance(answer, ListWorldsResponse)
        return answer

    async def _known_world(self, world: str) -> None:
        """Raises ``InputError`` unless ``world`` is a world's name and that world exists."""
        if not re.fullmatch(WORLD_PATTERN, world):
            raise InputError(
                f"world name {world!r} is not valid: a lowercase letter or digit, then up to 63 "
                "lowercase letters, digits, '_', '.' or '-'"
            )
        listed = await self.worlds(prefix=world)
        if all(summary.name != world for summary in listed.worlds):
            everyone = await self.worlds()
            names = [summary.name for summary in everyone.worlds][:10]
            more = everyone.total - len(names)
            raise InputError(
                f"no world {world!r}; worlds: {', '.join(names) or 'none yet'}"
                + (f" and {more} more" if more > 0 else "")
                + " ('stratagem world list')"
            )

    async def world(self, world: str) -> ShowWorldResponse:
        """Every entity and fact of ``world``.

        Raises:
            InputError: A malformed name, or no world of that name (the worlds there are named).
        """
        await self._known_world(world)
        answer = await self.call("perception", "ShowWorld", {"world": world})
        assert isinstance(answer, ShowWorldResponse)
        return answer

    async def reset_world(self, world: str) -> ResetWorldResponse:
        """Empty ``world`` (no entity, no fact; saved before this returns). Goals that name it
        start from nothing again.

        Raises:
            InputError: A malformed name, or no world of that name.
        """
        await self._known_world(world)
        answer = await self.call("perception", "ResetWorld", {"world": world})
        assert isinstance(answer, ResetWorldResponse)
        return answer

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
        value: Any = _NO_VALUE,
        arguments: Mapping[str, Any] | None = None,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Send one control action to the agent that owns ``plan_id``; the plan's state after it
        (for ``fork``, the new plan's).

        ``approve``, ``reject``, ``pause``, ``cancel``, ``resume``, ``replan`` and ``fork`` below
        are this with their arguments named.

        Raises:
            InputError: The arguments do not make a valid request (e.g. no rationale for a gate).
            PlanNotFoundError: No agent holds the plan.
            protocol.InvalidArgumentError: A value or arguments that do not fit the gate, a fork
                point that does not exist, an output for a step not before it.
            protocol.PermissionDeniedError: The gate is not for this caller.
            protocol.FailedPreconditionError: The action does not apply (a gate not open...).
        """
        plan_json = "" if plan is None else (await self._checked_plan(plan, plan_id=plan_id))[1]
        recorded = None if output is None else dict(output)
        edited = None if arguments is None else dict(arguments)
        substituted = None if not outputs else {k: dict(v) for k, v in outputs.items()}
        given: dict[str, Any] = {} if value is _NO_VALUE else {"value": value}
        try:
            ControlRequest(
                plan_id=plan_id,
                action=action,
                gate_id=gate_id,
                rationale=rationale,
                output_json="" if recorded is None else json.dumps(recorded),
                plan_json=plan_json,
                value_json=json.dumps(value) if given else "",
                arguments_json="" if edited is None else json.dumps(edited),
                at_step=at_step,
                at_revision=at_revision,
                set_json=json.dumps(substituted) if substituted else "",
                new_plan_id=new_plan_id,
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValidationError):
                raise InputError(validation_line(f"{action} of plan {plan_id!r}", exc)) from exc
            raise InputError(f"{action} of plan {plan_id!r}: not JSON: {exc}") from exc
        return await self._on_owner(
            plan_id,
            lambda client: client.control(
                plan_id,
                action,
                gate_id=gate_id,
                rationale=rationale,
                output=recorded,
                plan_json=plan_json,
                arguments=edited,
                at_step=at_step,
                at_revision=at_revision,
                outputs=substituted,
                new_plan_id=new_plan_id,
                timeout=timeout,
                **given,
            ),
        )

    async def approve(
        self,
        plan_id: str,
        gate_id: str,
        rationale: str,
        *,
        output: Mapping[str, Any] | None = None,
        value: Any = _NO_VALUE,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Approve a gate: its plan goes on (a reconciled step is re-run, or ``output`` recorded
        as its result when its effect was found done). A gate that asks takes its ``value``; a
        tool's approval gate may take the tool's ``arguments`` as edited (the plan then goes on
        as a new revision whose author is this caller)."""
        return await self.control(
            plan_id,
            "approve",
            gate_id=gate_id,
            rationale=rationale,
            output=output,
            value=value,
            arguments=arguments,
            timeout=timeout,
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

    async def fork(
        self,
        plan_id: str,
        *,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
        rationale: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> PlanSnapshot:
        """Fork a plan on its owner: a new plan (``new_plan_id``, or one the agent makes) whose
        steps before the fork point (``at_step`` of revision ``at_revision``; the end of the
        newest revision by default) carry their recorded results, ``outputs`` substituted for
        some, and which runs on from there; its snapshot as it starts (``forked_from`` in its
        plan JSON)."""
        return await self.control(
            plan_id,
            "fork",
            at_step=at_step,
            at_revision=at_revision,
            outputs=outputs,
            new_plan_id=new_plan_id,
            rationale=rationale,
            timeout=timeout,
        )

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


def _read_plan(plan: PlanSource, *, plan_id: str = "") -> tuple[str, dict[str, Any]]:
    """Where a plan comes from (for messages) and its mapping; ``plan_id``, when given, replaces
    the plan's id (a new revision of that plan)."""
    where = str(plan) if isinstance(plan, Path) else "the mapping given"
    raw = (
        read_mapping(plan, "a plan's id, owner and steps") if isinstance(plan, Path) else dict(plan)
    )
    check_plan_steps(where, raw)
    if plan_id:
        raw["id"] = plan_id
    return where, raw


def _typed_plan(where: str, raw: dict[str, Any], settings: Settings) -> tuple[str, Plan, list[str]]:
    """A plan as its owner's type: its owner, the typed plan and the tools of an agent of that
    role built here (without the MCP servers' tools, which only the running agent has).

    The agents are imported here, not with the module: most calls need none.
    """
    from stratagem.agents import ExtensionError, build_agent

    owner = raw.get("owner")
    roles = settings_roles(settings)
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
    return owner, typed, agent.registry.names()


def _plan_json(where: str, typed: Plan, tools: Sequence[str], settings: Settings) -> str:
    """Check a typed plan the way its owner will (``tools``: its owner's), as JSON."""
    from stratagem.planning import PlanValidationError, validate_plan

    targets: tuple[str, ...] = settings_roles(settings)
    if settings.a2a_agents:
        from stratagem.protocol._a2a._client import A2A_TARGET, register_a2a_capability

        register_a2a_capability()  # a step may then send a message to an external A2A agent
        targets = (*targets, A2A_TARGET)
    try:
        validate_plan(typed, tools=tools, roles=targets, capabilities=CAPABILITIES)
    except PlanValidationError as exc:
        raise InputError(f"plan {typed.id!r} refused: " + "; ".join(exc.problems)) from exc
    plan_json = typed.model_dump_json()
    check_encoded_size(where, plan_json, settings.max_message_bytes)
    return plan_json
