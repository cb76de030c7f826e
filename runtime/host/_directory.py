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

__all__ = [
    "AgentInfo",
    "EndpointDirectory",
    "GrpcDispatcher",
    "actor_name",
    "actor_record",
    "dead_actor_record",
    "death_cause",
]

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


def dead_actor_record(name: str) -> dict[str, Any]:
    """The actor table's record of the last dead actor called ``name`` (``{}``: none, or the
    table cannot be read). Ray's table does not say the namespace: informational only."""
    try:
        from ray._private import state

        records: dict[str, Any] = state.actors()
    except Exception:
        logger.debug("cannot read the actor table", exc_info=True)
        return {}
    dead = [r for r in records.values() if r.get("Name") == name and r.get("State") == "DEAD"]
    return max(dead, key=lambda r: r.get("EndTime", 0), default={})


# Ray's ActorDiedErrorContext.reason, in words.
_DEATH_REASONS = {
    "WORKER_DIED": "its worker process died",
    "OWNER_DIED": "the process that created it died",
    "NODE_DIED": "its node died",
    "RAY_KILL": "killed (ray.kill)",
    "OUT_OF_SCOPE": "no handle referred to it",
    "REF_DELETED": "its reference was deleted",
}


def death_cause(record: dict[str, Any]) -> str:
    """Why Ray says an actor died, in one line (``""`` when it is not dead or Ray does not say).

    Args:
        record: The actor's record (``actor_record``): its ``State`` and ``DeathCause`` (Ray's
            ``ActorDeathCause`` message) are read.
    """
    if record.get("State") != "DEAD":
        return ""
    cause: Any = record.get("DeathCause")
    kind = cause.WhichOneof("context") if cause is not None else None
    if kind == "oom_context":
        why = "out of memory"
    elif kind == "creation_task_failure_context":
        lines = cause.creation_task_failure_context.formatted_exception_string.strip().splitlines()
        why = f"its constructor failed: {lines[-1] if lines else 'unknown error'}"
    elif kind == "runtime_env_failed_context":
        why = f"its runtime environment failed: {cause.runtime_env_failed_context.error_message}"
    elif kind == "actor_unschedulable_context":
        why = f"unschedulable: {cause.actor_unschedulable_context.error_message}"
    elif kind == "actor_died_error_context":
        context = cause.actor_died_error_context
        reason = context.DESCRIPTOR.fields_by_name["reason"].enum_type.values_by_number
        name = reason[context.reason].name if context.reason in reason else ""
        why = _DEATH_REASONS.get(name) or context.error_message.strip().splitlines()[0]
    else:
        why = "cause unknown"
    restarts = record.get("NumRestarts")
    spent = f"; restarts spent ({restarts})" if restarts else ""
    if why == _DEATH_REASONS["RAY_KILL"]:
        # Killed for good: 'stratagem down', a redeploy, or someone's ray.kill (a restartable
        # kill, as a crash test makes, leaves it alive, restarted).
        return f"removed: killed (ray.kill) by 'stratagem down', a redeploy or by hand{spent}"
    return f"died: {why.strip()}{spent}"[:300]


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
        problem: What keeps it from serving, in one line: Ray's death cause of a dead agent
            (``died: out of memory``, ...), or a store problem the agent found itself.
        secret_id: The key id of the cluster secret it verifies tokens with (token mode; empty
            otherwise): ``up`` compares it with the operator's secret.
        a2a_url: Its A2A base URL (card at ``.well-known/agent-card.json``, JSON-RPC at the URL);
            empty when it serves no A2A.
        mcp_url: Its MCP face's URL (``mcp_ports``), or "" when it has none.
        health: ``serving`` (it answered and its gRPC endpoint accepts connections from here),
            ``unreachable`` (it answered but its endpoint refuses connections from here),
            ``not answering`` (it did not answer in time; see ``state``).
        traces: What its OTLP trace exporter did (``runtime.telemetry._export.ExportStats``: spans
            ``exported`` and ``skipped``, exports ``failed``, the ``endpoint``); empty when it
            exports to no backend.
        extensions: The extensions it loaded (``None`` from an agent of a build that did not
            say).
        model: The model its planner (and research) uses, ``NAME (TIER)`` (``... at URL`` on a
            tier's own server; ``runtime.host._models.role_model``); "" when it plans by rules.
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
    secret_id: str = ""
    problem: str = ""
    a2a_url: str = ""
    mcp_url: str = ""
    traces: dict[str, Any] = field(default_factory=dict)
    extensions: list[str] | None = None
    model: str = ""

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


@dataclass(eq=False)
class _Channel:
    """A client to one endpoint and the calls using it now; a retired one closes after the last."""

    client: AgentClient
    calls: int = 0
    retired: bool = False


class GrpcDispatcher:
    """``planning.Dispatcher`` over gRPC: sends a plan's cross-agent steps to other agents.

    One client (channel) per endpoint, shared by the calls to it. A call answered ``UNAVAILABLE``
    makes the next call resolve the role's endpoint again and open a new client; the old one is
    closed once the calls still using it have ended (closing it at once would cancel them: a
    sibling step's answer must not end another step's call).
    """

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
        self._channels: dict[str, _Channel] = {}
        self._retired: set[_Channel] = set()

    async def dispatch(self, call: CrossAgentCall) -> WireModel:
        """Send one cross-agent step and return the typed answer.

        Raises:
            protocol.RemoteError: The call ended with a non-OK status.
        """
        endpoint = await self._directory.resolve(call.target)
        held = self._channels.get(endpoint)
        if held is None:
            held = self._channels[endpoint] = _Channel(
                AgentClient(
                    endpoint,
                    caller=self._caller,
                    credentials=self._credentials,
                    config=self._config,
                )
            )
        held.calls += 1
        try:
            return await held.client.call(
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
            if self._channels.get(endpoint) is held:
                del self._channels[endpoint]
                held.retired = True
                self._retired.add(held)
            raise
        finally:
            held.calls -= 1
            if held.retired and held.calls == 0:
                self._retired.discard(held)
                await held.client.aclose()

    async def aclose(self) -> None:
        """Close every client channel."""
        channels = [*self._channels.values(), *self._retired]
        self._channels, self._retired = {}, set()
        for held in channels:
            await held.client.aclose()
