"""A durable orchestrator agent in an OS process of its own, for the tests that kill it.

``python -m tests.integration._orchestrator_process STORE PERCEPTION_ENDPOINT [EXTENSION]`` builds
the real orchestrator agent with a ``SqliteStateStore`` at ``STORE`` and a ``GrpcDispatcher`` that
sends its cross-agent steps to ``PERCEPTION_ENDPOINT`` (or, when it is a JSON object, to the
endpoint it gives each role), with the extension module ``EXTENSION`` loaded, and serves it with
an ``AgentServer`` on 127.0.0.1 (a free port) without authentication (the ``x-stratagem-caller``
metadata is trusted) under the shipped policy.

It reports ``port <port>`` on standard output once it serves, and serves until its standard input
closes (then shuts down gracefully) or it is killed.
"""

from __future__ import annotations

import asyncio
import json
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


class RoleDirectory(EndpointDirectory):
    """Each role at the endpoint given for it, without Ray."""

    def __init__(self, endpoints: dict[str, str]) -> None:
        super().__init__("test")
        self.endpoints = endpoints

    async def resolve(self, role: str) -> str:
        return self.endpoints[role]

    def invalidate(self, role: str) -> None:
        pass


def directory_of(where: str) -> EndpointDirectory:
    """``where`` as a directory: one endpoint for every role, or a JSON object role -> endpoint."""
    if where.startswith("{"):
        return RoleDirectory(json.loads(where))
    return FixedDirectory(where)


async def _serve(store_path: Path, where: str, extensions: list[str]) -> None:
    store = SqliteStateStore(store_path)
    await store.start()
    dispatcher = GrpcDispatcher("orchestrator", directory_of(where))
    agent = build_agent(
        "orchestrator",
        dispatcher=dispatcher,
        entry_points=False,
        store=store,
        extensions=extensions,
    )
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
    if len(sys.argv) not in (3, 4):
        sys.stderr.write(
            "usage: python -m tests.integration._orchestrator_process STORE PERCEPTION_ENDPOINT"
            " [EXTENSION]\n"
        )
        return 2
    asyncio.run(_serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
