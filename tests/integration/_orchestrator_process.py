"""A durable orchestrator agent in an OS process of its own, for the tests that kill it.

``python -m tests.integration._orchestrator_process STORE PERCEPTION_ENDPOINT`` builds the real
orchestrator agent with a ``SqliteStateStore`` at ``STORE`` and a ``GrpcDispatcher`` that sends
its cross-agent steps to ``PERCEPTION_ENDPOINT``, and serves it with an ``AgentServer`` on
127.0.0.1 (a free port) without authentication (the ``x-stratagem-caller`` metadata is trusted)
under the shipped policy.

It reports ``port <port>`` on standard output once it serves, and serves until its standard input
closes (then shuts down gracefully) or it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from stratagem.agents import build_agent
from stratagem.planning import SqliteStateStore
from stratagem.protocol import (
    AgentServer,
    CallerMetadataAuthenticator,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
)
from stratagem.runtime.host._directory import EndpointDirectory, GrpcDispatcher


class FixedDirectory(EndpointDirectory):
    """Every role at one endpoint, without Ray."""

    def __init__(self, endpoint: str) -> None:
        super().__init__("test")
        self.endpoint = endpoint

    async def resolve(self, role: str) -> str:
        return self.endpoint

    def invalidate(self, role: str) -> None:
        pass


async def _serve(store_path: Path, perception: str) -> None:
    store = SqliteStateStore(store_path)
    await store.start()
    dispatcher = GrpcDispatcher("orchestrator", FixedDirectory(perception))
    agent = build_agent("orchestrator", dispatcher=dispatcher, entry_points=False, store=store)
    server = AgentServer(
        agent,
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
        config=ServerConfig(host="127.0.0.1", port=0, default_deadline_s=120.0, grace_s=0.5),
    )
    port = await server.start()
    sys.stdout.write(f"port {port}\n")
    sys.stdout.flush()
    try:
        # Blocks a worker thread, not the loop, until the parent closes our stdin.
        await asyncio.to_thread(sys.stdin.read)
    finally:
        await server.aclose()
        await agent.aclose()
        await dispatcher.aclose()
        await store.aclose()


def main() -> int:
    """Serve until stdin closes; the exit status is 2 on a usage error."""
    if len(sys.argv) != 3:
        sys.stderr.write(
            "usage: python -m tests.integration._orchestrator_process STORE PERCEPTION_ENDPOINT\n"
        )
        return 2
    asyncio.run(_serve(Path(sys.argv[1]), sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
