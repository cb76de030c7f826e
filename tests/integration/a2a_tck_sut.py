"""The A2A TCK's system under test: the TCK's scenario agent served by Stratagem's A2A face.

``python -m tests.integration.a2a_tck_sut PORT`` serves the scenario agent
(``a2a_tck_agent``: an agent of the SUT's own, defined with ``define_agent``) behind its real
``AgentServer`` (the default policy plus the agent's entries and the TCK's reading rights, an
audit log in memory) and its ``A2AServer`` on 127.0.0.1:PORT, prints ``ready URL`` and serves
until terminated.

The TCK sends no credentials, so this agent verifies callers with ``AnonymousAuthenticator``: a
call without credentials is the TCK's identity (``tck``), which the policy lets play scenarios,
read its plans, watch them, cancel them and answer what they ask (``Control.approve``), nothing
more. Everything else is the product's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping
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
from tests.integration.a2a_tck_agent import IDENTITY, ROLE, SCENARIO_AGENT


class AnonymousAuthenticator:
    """Every caller is the TCK (``tck``): the TCK speaks A2A without credentials."""

    @property
    def mode(self) -> str:
        return "none"

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        return IDENTITY

    def server_credentials(self) -> Any:
        return None


@contextlib.asynccontextmanager
async def serving(port: int = 0) -> AsyncIterator[A2AServer]:
    """The scenario agent, served over A2A on 127.0.0.1:``port`` (0: a free one)."""
    agent = build_agent(ROLE, entry_points=False)
    policy = Policy(
        [
            *Policy.default().rules,
            *SCENARIO_AGENT.policy_rules(),
            PolicyRule(
                caller=IDENTITY,
                target=ROLE,
                capabilities=frozenset({"Plans", "Watch", "Control.cancel", "Control.approve"}),
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
    try:
        async with A2AServer(server, agent, A2AConfig(port=port)) as a2a:
            yield a2a
    finally:
        await server.aclose()
        await agent.aclose()


async def serve(port: int) -> None:
    async with serving(port) as a2a:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"ready {a2a.url}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
