"""Agents served to each other in one process: ``serve_in_memory``.

A cross-agent call through a ``planning.InMemoryDispatcher`` becomes the target agent's
``handle``, with the call context the dispatcher sets: plan ids, deadlines and errors behave as
behind the gRPC server, without authorization, audit or the wire.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from stratagem.planning import Handler, InMemoryDispatcher
from stratagem.protocol import CallContext, WireModel, current_call

__all__ = ["serve_in_memory"]


class _Served(Protocol):
    """What serving an agent in-process needs of it (an ``Agent`` has it)."""

    @property
    def role(self) -> str: ...

    @property
    def capabilities(self) -> Mapping[str, Any]: ...

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel: ...


def serve_in_memory(dispatcher: InMemoryDispatcher, agents: Iterable[_Served]) -> None:
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


def _in_memory_handler(agent: _Served, capability: str) -> Handler:
    async def handler(request: WireModel) -> WireModel:
        ctx = current_call.get() or CallContext(
            caller="", target=agent.role, capability=capability, request_id=uuid.uuid4().hex
        )
        return await agent.handle(capability, request, ctx)

    return handler
