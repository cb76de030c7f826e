"""The operator's link to a deployment's agents: its settings and caller, where the agents are, the
caller's credentials and one gRPC client per endpoint. Every part of ``Operator`` that talks to
an agent does it through the ``Link`` (``_compose``); the checks of names a call takes
(``check_role``, ``check_status``, ``capability_spec``) and the operator's settings are here too.

Where the agents are, in this order:

1. ``endpoints`` given to the constructor: those, and nothing else;
2. the endpoints the agents published in ``STATE_DIR/endpoints/<role>.json``, when this machine
   runs the deployment (``stratagem up`` without an address: see ``runtime.host._local``), each used
   only once the agent there proved it holds the deployment's key (``protocol.prove_endpoint``;
   before that nothing but a nonce is sent). The caller does not join Ray;
3. otherwise, or when an agent does not answer at its published endpoint, the ``Directory``: by
   default Ray's (``RayDirectory``), which makes this process a Ray driver until ``aclose``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from pydantic import ValidationError
from pydantic_settings import SettingsError

from stratagem.protocol import (
    CAPABILITIES,
    OPERATOR,
    ROLES,
    AgentClient,
    CapabilitySpec,
    ClientConfig,
    Credentials,
    InvalidArgumentError,
    ProtocolUsageError,
    RemoteError,
    UnavailableError,
    UntrustedEndpointError,
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
from stratagem.runtime.operator._input import (
    InputError,
    check_timeout,
    unknown_name,
    validation_line,
)

__all__ = [
    "RAY_DIRECTORY",
    "Directory",
    "Link",
    "capability_spec",
    "check_role",
    "check_status",
    "operator_settings",
    "ray_directory",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PROOF_TIMEOUT_S = 10.0
"""The longest an agent at a published endpoint is given to prove its key (it answers in
milliseconds unless stopped)."""


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


class Link:
    """The way to a deployment's agents, as ``caller``: see the module docstring and
    ``Operator``'s arguments (checked here).

    Raises:
        InputError: ``timeout_s`` is out of range, or ``caller`` is an identity the operator may
            not be.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        caller: str = OPERATOR,
        timeout_s: float | None = None,
        endpoints: Mapping[str, str] | None = None,
        directory: Directory | None = None,
    ) -> None:
        self.settings = settings
        self.caller = caller
        if caller != OPERATOR:
            try:
                check_operator_identity(settings, caller, self.roles)
            except IdentityRefusedError as exc:
                raise InputError(str(exc)) from exc
        self.config = ClientConfig(
            default_timeout_s=check_timeout(timeout_s) or settings.request_timeout_s
        )
        """The clients' configuration: ``default_timeout_s`` is a call's deadline by default."""
        self.timeout_given = timeout_s is not None
        """Whether the operator was made with its own deadline (a goal's then follows it)."""
        self._fixed = dict(endpoints) if endpoints is not None else None
        self._directory = directory or ray_directory(settings)
        self._from_directory = False  # once asked, the directory answers for every later call
        self._credentials: Credentials | None = None
        self._credentials_made = False  # on first use: a bad secret fails the call, not the setup
        self._clients: dict[str, AgentClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proven: set[tuple[str, str]] = set()  # (role, endpoint) that proved the key

    async def aclose(self) -> None:
        """Close every channel, and let go of the directory (a Ray connection)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        await self._directory.aclose()

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role: the built-in four, then those the settings' extensions define
        (imported on first use, as the agents import them).

        Raises:
            InputError: An extension does not load, or defines an agent badly.
        """
        return settings_roles(self.settings)

    def check_role(self, agent: str) -> None:
        """Raises ``InputError`` unless ``agent`` is one of ``roles``."""
        check_role(agent, self.roles)

    async def endpoints(self, roles: Sequence[str] | None = None) -> dict[str, str]:
        """Each of ``roles``' endpoint (every agent's by default), found as the module docstring
        says."""
        found, _ = await self.find(self.roles if roles is None else roles)
        return found

    async def find(
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
        credentials = self.credentials()
        # Half the call's deadline at most: a stopped agent is named before the deadline passes.
        timeout = min(_PROOF_TIMEOUT_S, self.config.default_timeout_s / 2)
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

    def credentials(self) -> Credentials | None:
        """The caller's credentials (made on first use, as ``STRATAGEM_AUTH`` says)."""
        if not self._credentials_made:
            try:
                self._credentials = credentials_for(self.settings, self.caller)
            except IdentityRefusedError as exc:  # a key of another identity: the caller's input
                raise InputError(str(exc)) from exc
            self._credentials_made = True
        return self._credentials

    def client(self, endpoint: str) -> AgentClient:
        """The client of the agent at ``endpoint`` (one per endpoint, on the first call's loop)."""
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
                credentials=self.credentials(),
                config=self.config,
            )
        return client

    async def at(self, role: str, send: Callable[[AgentClient], Awaitable[T]]) -> T:
        """``send`` to ``role``'s agent; asked again through the directory when its published
        endpoint does not answer (``send`` must be safe to repeat: same request id)."""
        endpoints, published = await self.find((role,))
        try:
            return await send(self.client(endpoints[role]))
        except UnavailableError:
            if not published:
                raise
            logger.info("no answer at %s's published endpoint %s: asking Ray", role, endpoints)
        endpoints, _ = await self.find((role,), published=False)
        return await send(self.client(endpoints[role]))

    async def across(
        self, roles: Sequence[str], send: Callable[[AgentClient], Awaitable[T]]
    ) -> list[tuple[str, T]]:
        """``send`` to each of ``roles``' agents in turn (a read: safe to repeat)."""
        endpoints, published = await self.find(roles)
        try:
            return [(role, await send(self.client(endpoints[role]))) for role in roles]
        except UnavailableError:
            if not published:
                raise
            logger.info("no answer at a published endpoint of %s: asking Ray", endpoints)
        endpoints, _ = await self.find(roles, published=False)
        return [(role, await send(self.client(endpoints[role]))) for role in roles]

    async def each(
        self, roles: Sequence[str], send: Callable[[str, AgentClient], Awaitable[T]]
    ) -> tuple[list[tuple[str, T]], list[str]]:
        """``send`` to each of ``roles``' agents; an agent that cannot answer is named in the
        second list (one line each) and the others' answers are kept. A refused request
        (``InvalidArgumentError``) is raised: it is the caller's."""
        found: list[tuple[str, T]] = []
        unreadable: list[str] = []
        endpoints, published = await self.find(roles)
        for role in roles:
            try:
                try:
                    found.append((role, await send(role, self.client(endpoints[role]))))
                except UnavailableError:
                    if not published:
                        raise
                    logger.info("no answer at %s's published endpoint: asking Ray", role)
                    fresh, _ = await self.find((role,), published=False)
                    found.append((role, await send(role, self.client(fresh[role]))))
            except InvalidArgumentError:
                raise
            except (RemoteError, LaunchError) as exc:
                unreadable.append(f"{role}: {exc}")
        return found, unreadable
