"""Plans calling external A2A agents: a dispatcher sending ``a2a`` steps over A2A.

The client side of A2A, beside the client side of MCP (``agents._mcp``: MCP servers' tools as an
agent's tools); the wire parts of both (the A2A client, the capability, the configurations) are in
``protocol._a2a`` and ``protocol._mcp``, and the faces that serve them in ``protocol.FACES``.

``A2ADispatcher`` wraps an agent's dispatcher: a cross-agent step whose target is ``a2a`` (the
``SendA2AMessage`` capability) goes to the external agent its request names
(``STRATAGEM_A2A_AGENTS``: URL and credentials), every other step to the wrapped dispatcher.
Before sending, the agent's policy must allow it (caller: this agent, target ``a2a``,
capability: the external agent's name; default deny), and every call leaves two records in the
agent's audit log: ``a2a.sent`` (the request's digest, the plan and step) and ``a2a.outcome``
(the code, the answer's digest), or ``a2a.denied``. The call is a client span
(``a2a SendMessage <name>``) whose context travels in the HTTP request. The step's request id
is the message id (the same on every retry: exactly once where the remote honours message ids);
its deadline is the step's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from stratagem.planning import CrossAgentCall, Dispatcher
from stratagem.protocol import (
    AuditLog,
    InvalidArgumentError,
    PermissionDeniedError,
    Policy,
    RemoteError,
    WireModel,
    digest,
)
from stratagem.protocol._a2a._client import (
    A2A_TARGET,
    A2AAgentClient,
    A2APeerConfig,
    A2ASkill,
    SendA2AMessageRequest,
    register_a2a_capability,
)
from stratagem.protocol._audit import AsyncAuditLog

__all__ = ["A2ADispatcher", "peers_from"]

logger = logging.getLogger(__name__)


def peers_from(
    agents: Mapping[str, object], tokens: Mapping[str, str] | None = None
) -> dict[str, A2APeerConfig]:
    """The external agents of the settings' ``a2a_agents`` (``runtime.A2APeer`` values), with
    their tokens (handed over apart from the settings, as secrets are)."""
    peers = {}
    for name, peer in agents.items():
        token = (tokens or {}).get(name, "")
        secret = getattr(peer, "token", None)
        if not token and secret is not None:
            token = secret.get_secret_value()
        peers[name] = A2APeerConfig(
            name=name,
            url=str(getattr(peer, "url", "")),
            token=token,
            skill=str(getattr(peer, "skill", "")),
            timeout_s=float(getattr(peer, "timeout_s", 60.0)),
            read_only_skills=tuple(getattr(peer, "read_only_skills", ())),
        )
    return peers


class A2ADispatcher:
    """``planning.Dispatcher``: ``a2a`` steps to external A2A agents, the rest to ``inner``.

    Args:
        inner: The agent's own dispatcher (gRPC to the other agents).
        caller: This agent's role (the policy's caller, the audit records' actor).
        peers: The external agents by name.
        policy: Who may call which external agent (target ``a2a``, capability: its name).
        audit: Where the calls are recorded.
        tracer_provider: Where the client spans go; the global one when ``None``.
    """

    def __init__(
        self,
        inner: Dispatcher,
        *,
        caller: str,
        peers: Mapping[str, A2APeerConfig],
        policy: Policy,
        audit: AuditLog,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        register_a2a_capability()
        self._inner = inner
        self._caller = caller
        self._peers = dict(peers)
        self._clients: dict[str, A2AAgentClient] = {}
        self._skills: dict[str, list[A2ASkill]] = {}
        self._policy = policy
        self._audit = audit
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)

    async def skills(self) -> dict[str, list[A2ASkill]]:
        """The skills each external agent's card lists, by agent name: read once per agent
        (an agent whose card cannot be read is left out, logged, and asked again next time)."""
        for name, peer in self._peers.items():
            if name in self._skills:
                continue
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = A2AAgentClient(peer)
            try:
                self._skills[name] = await client.skills()
            except RemoteError as exc:
                logger.warning("the card of the A2A agent %s: %s", name, exc.message)
        return dict(self._skills)

    async def dispatch(self, call: CrossAgentCall) -> WireModel:
        """Send one cross-agent step: over A2A when its target is ``a2a``.

        Raises:
            protocol.RemoteError: The external agent's refusal or failure, or this agent's
                policy's (``PERMISSION_DENIED``), or an unknown external agent
                (``INVALID_ARGUMENT``).
        """
        if call.target != A2A_TARGET:
            return await self._inner.dispatch(call)
        request = SendA2AMessageRequest.model_validate(call.request.model_dump())
        name = request.agent
        target = f"{A2A_TARGET}:{name}"
        peer = self._peers.get(name)
        if peer is None:
            known = ", ".join(sorted(self._peers)) or "none"
            raise InvalidArgumentError(
                f"no external A2A agent {name!r} is configured (STRATAGEM_A2A_AGENTS: {known})"
            )
        request_digest = digest(
            json.dumps(request.model_dump(mode="json"), sort_keys=True).encode()
        )
        where = f"plan {call.plan_id} step {call.step_id}"
        if not self._policy.allows(self._caller, A2A_TARGET, name):
            await self._record(
                "a2a.denied", target, call, "PERMISSION_DENIED", where, request_digest
            )
            raise PermissionDeniedError(f"{self._caller!r} may not call the A2A agent {name!r}")
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = A2AAgentClient(peer)
        await self._record("a2a.sent", target, call, "", f"{where} -> {peer.url}", request_digest)
        with self._tracer.start_as_current_span(
            f"a2a SendMessage {name}",
            kind=SpanKind.CLIENT,
            attributes={
                "rpc.system": "a2a",
                "rpc.method": "SendMessage",
                "server.address": peer.url,
                "stratagem.plan.id": call.plan_id,
                "stratagem.step.id": call.step_id,
                "stratagem.request.id": call.request_id,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await client.send(
                    request, message_id=call.request_id, timeout_s=call.timeout_s
                )
            except RemoteError as error:
                span.set_status(Status(StatusCode.ERROR, f"{error.code}: {error.message}"))
                await self._record(
                    "a2a.outcome", target, call, error.code.value, error.message, request_digest
                )
                raise
        answer = json.dumps(response.model_dump(mode="json"), sort_keys=True).encode()
        detail = f"task {response.task_id} {response.state}".strip()
        await self._record("a2a.outcome", target, call, "OK", detail, digest(answer))
        return response

    async def _record(
        self, action: str, target: str, call: CrossAgentCall, code: str, detail: str, hashed: str
    ) -> None:
        fields = {
            "actor": self._caller,
            "action": action,
            "target": target,
            "capability": call.capability,
            "request_id": call.request_id,
            "code": code,
            "detail": detail,
            "digest": hashed,
        }
        if isinstance(self._audit, AsyncAuditLog):
            await self._audit.append_async(**fields)
        else:
            await asyncio.shield(asyncio.to_thread(self._audit.append, **fields))

    async def aclose(self) -> None:
        """Close the external agents' clients and the wrapped dispatcher."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()
