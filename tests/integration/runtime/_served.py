"""The four real agents served over gRPC on 127.0.0.1 in this process, without Ray, for the tests
of the operator API and of the commands over it.

``serve`` deploys them with durable SQLite stores and token authentication (a cluster secret in
the state directory) and publishes their endpoints as the agent actors do, with this process
standing in for the local Ray head. A recording directory stands in for Ray's: it answers with the
same endpoints and counts how often it was asked.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratagem.agents import Agent, build_agent, serve_in_memory
from stratagem.planning import InMemoryDispatcher, StateStore
from stratagem.protocol import (
    ROLES,
    AgentServer,
    AuditLog,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
)
from stratagem.runtime import LocalCluster, Operator, Settings, load_settings
from stratagem.runtime.config._stores import open_state_store
from stratagem.runtime.host._local import publish_endpoint

__all__ = [
    "REPO",
    "WHO_LEADS",
    "RecordingDirectory",
    "Served",
    "gated_plan",
    "serve",
    "served_in_a_thread",
    "settings_for",
]

REPO = Path(__file__).resolve().parents[3]
WHO_LEADS = REPO / "examples" / "plans" / "who-leads.yaml"


class RecordingDirectory:
    """A directory that knows the endpoints it was given and counts how often it was asked."""

    def __init__(self, endpoints: dict[str, str]) -> None:
        self._endpoints = endpoints
        self.asked = 0
        self.closed = False

    async def endpoints(self) -> dict[str, str]:
        self.asked += 1
        return dict(self._endpoints)

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class Served:
    settings: Settings
    endpoints: dict[str, str]
    directory: RecordingDirectory
    stop: Callable[[], Awaitable[None]]
    agents: dict[str, Agent] | None = None
    servers: dict[str, AgentServer] = field(default_factory=dict)

    async def stop_agent(self, role: str) -> None:
        """Stop one agent's server (its published endpoint then refuses connections)."""
        await self.servers[role].aclose()

    def operator(self, **options: Any) -> Operator:
        return Operator(settings=self.settings, directory=self.directory, **options)


def settings_for(state_dir: Path) -> Settings:
    return load_settings(
        state_dir=state_dir, auth="token", secret_file=state_dir / "cluster.secret", address=None
    )


async def serve(
    state_dir: Path, *, audit: AuditLog | None = None, policy: Policy | None = None
) -> Served:
    """The four agents, served and published in ``state_dir`` (this process as the Ray head),
    auditing to ``audit`` (one in memory when ``None``), under ``policy`` (the default one when
    ``None``)."""
    settings = settings_for(state_dir)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    secret = ClusterSecret.load_or_create(settings.secret_path)
    dispatcher = InMemoryDispatcher()
    stores: list[StateStore] = []
    agents: dict[str, Agent] = {}
    for role in ROLES:
        stores.append(await open_state_store(settings, role))
        agents[role] = build_agent(
            role, dispatcher=dispatcher, entry_points=False, store=stores[-1]
        )
    serve_in_memory(dispatcher, agents.values())
    servers = [
        AgentServer(
            agent,
            policy=policy or Policy.default(),
            authenticator=TokenAuthenticator(TokenSigner(secret)),
            audit=audit if audit is not None else InMemoryAuditLog(),
            config=ServerConfig(host="127.0.0.1", port=0, default_deadline_s=20.0),
        )
        for agent in agents.values()
    ]
    for server in servers:
        await server.start()
    endpoints = {role: server.endpoint for role, server in zip(ROLES, servers, strict=True)}
    for role, endpoint in endpoints.items():
        publish_endpoint(settings.state_dir, role, endpoint, os.getpid())
    LocalCluster(address="127.0.0.1:1", pid=os.getpid()).write(settings.local_cluster_file)

    async def stop() -> None:
        for server in servers:
            await server.aclose()
        for agent in agents.values():
            await agent.aclose()
        for store in stores:
            await store.aclose()

    return Served(
        settings,
        endpoints,
        RecordingDirectory(endpoints),
        stop,
        agents,
        dict(zip(ROLES, servers, strict=True)),
    )


@contextmanager
def served_in_a_thread(state_dir: Path, *, policy: Policy | None = None) -> Iterator[Served]:
    """The agents served on an event loop of their own, so blocking code can call them."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    served = asyncio.run_coroutine_threadsafe(serve(state_dir, policy=policy), loop).result(30)
    try:
        yield served
    finally:
        asyncio.run_coroutine_threadsafe(served.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def gated_plan(plan_id: str) -> dict[str, Any]:
    return {
        "id": plan_id,
        "owner": "strategic",
        "goal": "wait for a yes",
        "steps": [
            {"kind": "gate", "id": "ok", "prompt": "Go on?"},
            {
                "kind": "tool",
                "id": "protagonist",
                "tool": "find_protagonist",
                "input": {"text": "Mira wants the silver crown.", "entities": []},
                "depends_on": ["ok"],
            },
        ],
    }
