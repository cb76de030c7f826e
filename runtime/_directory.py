"""Endpoint directory and the gRPC dispatcher that agents use to reach each other.

Every agent actor is a named Ray actor (``stratagem-<role>`` in the deployment's namespace) whose
``info`` method answers with the address of its gRPC server. The directory resolves a role to
that address once and caches it; when a call finds the endpoint unavailable (the agent died and Ray
restarted it on a new port, perhaps on another node) the entry is dropped and resolved again on the
next attempt.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import ray

from stratagem.planning import CrossAgentCall
from stratagem.protocol import AgentClient, ClientConfig, Credentials, UnavailableError, WireModel

__all__ = ["AgentInfo", "EndpointDirectory", "GrpcDispatcher", "actor_name", "actor_record"]

logger = logging.getLogger(__name__)


def actor_name(role: str) -> str:
    """The named-actor name of a role's agent."""
    return f"stratagem-{role}"


def actor_record(actor_id: str | None) -> dict[str, Any]:
    """The GCS actor table's record of an actor (``State``, ``NumRestarts``, ``Address``, ``Pid``,
    ...), or ``{}`` when it cannot be read.

    Ray's public state API needs the dashboard; this reads the table through ``ray._private.state``
    (a debugging interface), so a failure is tolerated: what it gives is informational.
    """
    if actor_id is None:
        return {}
    try:
        from ray._private import state

        record: dict[str, Any] = state.actors(actor_id=actor_id)
        return record
    except Exception:
        logger.debug("cannot read the actor table", exc_info=True)
        return {}


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """Where an agent runs, how to reach it and how it is doing.

    Attributes:
        role: The agent's role.
        endpoint: Its gRPC server's ``HOST:PORT`` (empty while it does not answer).
        node_id: The Ray node it runs on.
        node_ip: That node's address (the gRPC server binds to it on a cluster).
        pid: The actor's process.
        restarted: Whether Ray restarted the actor at least once.
        plans_running: Plans the agent is running now (its in-flight plans).
        plans_blocked: Plans waiting at a gate.
        restarts: How often Ray restarted the actor (``None`` when Ray cannot tell).
        state: Ray's state of the actor: ``ALIVE``, ``RESTARTING``, ``PENDING_CREATION``, ``DEAD``.
        node_labels: The labels of its node (Ray's own ``ray.io/*`` labels left out).
        settings_digest: A digest of the settings it was deployed with.
        health: ``serving`` (it answered and its gRPC endpoint accepts connections from here),
            ``unreachable`` (it answered but its endpoint refuses connections from here),
            ``not answering`` (it did not answer in time; see ``state``).
    """

    role: str
    endpoint: str
    node_id: str
    node_ip: str
    pid: int
    restarted: bool
    plans_running: int
    plans_blocked: int = 0
    restarts: int | None = None
    state: str = "ALIVE"
    health: str = "serving"
    node_labels: dict[str, str] = field(default_factory=dict)
    settings_digest: str = ""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AgentInfo:
        """Build from the dict an actor's ``info`` method returns."""
        return cls(**raw)


class EndpointDirectory:
    """Resolves roles to gRPC endpoints through the named agent actors."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._cache: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def resolve(self, role: str) -> str:
        """The endpoint of ``role``'s agent.

        Raises:
            UnavailableError: No agent of that role is deployed or it does not answer.
        """
        cached = self._cache.get(role)
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._cache.get(role)
            if cached is not None:
                return cached
            try:
                handle = await asyncio.to_thread(
                    ray.get_actor, actor_name(role), namespace=self._namespace
                )
                info: dict[str, Any] = await handle.info.remote()
            except ValueError as exc:
                raise UnavailableError(f"no {role} agent is deployed") from exc
            except ray.exceptions.RayActorError as exc:
                raise UnavailableError(f"the {role} agent is not running") from exc
            endpoint = str(info["endpoint"])
            self._cache[role] = endpoint
            return endpoint

    def invalidate(self, role: str) -> None:
        """Forget ``role``'s endpoint so the next ``resolve`` asks its actor again."""
        self._cache.pop(role, None)


class GrpcDispatcher:
    """``planning.Dispatcher`` over gRPC: sends a plan's cross-agent steps to other agents."""

    def __init__(
        self,
        caller: str,
        directory: EndpointDirectory,
        config: ClientConfig | None = None,
        *,
        credentials: Credentials | None = None,
    ) -> None:
        self._caller = caller
        self._credentials = credentials
        self._directory = directory
        self._config = config or ClientConfig()
        self._clients: dict[str, AgentClient] = {}

    async def dispatch(self, call: CrossAgentCall) -> WireModel:
        """Send one cross-agent step and return the typed answer.

        Raises:
            protocol.RemoteError: The call ended with a non-OK status.
        """
        endpoint = await self._directory.resolve(call.target)
        client = self._clients.get(endpoint)
        if client is None:
            client = AgentClient(
                endpoint, caller=self._caller, credentials=self._credentials, config=self._config
            )
            self._clients[endpoint] = client
        try:
            return await client.call(
                call.target,
                call.capability,
                call.request,
                timeout=call.timeout_s,
                request_id=call.request_id,
                plan_id=call.plan_id,
                step_id=call.step_id,
            )
        except UnavailableError:
            self._directory.invalidate(call.target)
            stale = self._clients.pop(endpoint, None)
            if stale is not None:
                await stale.aclose()
            raise

    async def aclose(self) -> None:
        """Close every client channel."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
