"""A Stratagem agent served over A2A for the official A2A TCK (``a2aproject/a2a-tck``).

``python -m tests.integration.a2a_tck_sut PORT`` serves the perception agent behind its real
``AgentServer`` (the default policy plus the TCK's identity, an audit log in memory) and its
``A2AServer`` on 127.0.0.1:PORT, prints ``ready URL`` and serves until terminated.

The TCK sends no credentials, so this agent verifies callers with ``AnonymousAuthenticator``: a
call without credentials is the TCK's identity (``tck``), which the policy lets extract entities,
read its plans, watch them and cancel them, nothing more. Everything else is the product's path.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping
from typing import Any

from stratagem.agents import build_agent
from stratagem.protocol import (
    A2AConfig,
    A2AServer,
    AgentServer,
    InMemoryAuditLog,
    Policy,
    PolicyRule,
    ServerConfig,
)

IDENTITY = "tck"


class AnonymousAuthenticator:
    """Every caller is the TCK (``tck``): the TCK speaks A2A without credentials."""

    @property
    def mode(self) -> str:
        return "none"

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        return IDENTITY

    def server_credentials(self) -> Any:
        return None


async def serve(port: int) -> None:
    agent = build_agent("perception")
    policy = Policy(
        [
            *Policy.default().rules,
            PolicyRule(
                caller=IDENTITY,
                target="perception",
                capabilities=frozenset({"ExtractEntities", "Plans", "Watch", "Control.cancel"}),
            ),
        ]
    )
    server = AgentServer(
        agent,
        policy=policy,
        authenticator=AnonymousAuthenticator(),
        audit=InMemoryAuditLog(),
        config=ServerConfig(default_deadline_s=30.0, grace_s=1.0),
    )
    await server.start()
    a2a = A2AServer(server, agent, A2AConfig(port=port))
    await a2a.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {a2a.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await a2a.aclose()
        await server.aclose()
        await agent.aclose()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
