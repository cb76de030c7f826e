"""The agent actor: one role agent and its gRPC server in one Ray actor process.

The actor is async: Ray runs its methods on the actor's event loop, the same loop that serves gRPC.
Its constructor builds the agent and starts the server, so when Ray restarts a dead actor
(``max_restarts``) the restarted one serves again on a fresh port and peers find it through the
directory.

Each agent keeps its plans in ``STATE_DIR/<role>.plans.sqlite3`` (a ``planning.SqliteStateStore``)
and its answers to cross-agent requests in ``STATE_DIR/<role>.answers.sqlite3`` (a
``protocol.SqliteAnswerStore``). Once serving, the constructor resumes every unfinished plan of the
agent from its store, so a restarted actor continues where its predecessor died: completed steps are
skipped, an in-flight step is re-run only when idempotent (otherwise its plan waits at a reconcile
gate for ``stratagem approve|reject``), and a repeated request from a peer gets the stored answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import ray

from agents import build_agent
from planning import EngineConfig, SqliteStateStore
from protocol import (
    AgentServer,
    AnswerRetention,
    Policy,
    ServerConfig,
    SqliteAnswerStore,
    SqliteAuditLog,
)
from runtime._directory import EndpointDirectory, GrpcDispatcher
from runtime._settings import Settings
from runtime._telemetry import setup_telemetry, shutdown_telemetry

__all__ = ["AgentActor", "load_policy"]

logger = logging.getLogger(__name__)


def load_policy(settings: Settings) -> Policy:
    """The authorization policy: the configured file, or the built-in default."""
    if settings.policy_file is not None:
        return Policy.load(settings.policy_file)
    return Policy.default()


class AgentActor:
    """Hosts one role agent and serves it over gRPC (used as a Ray actor class)."""

    # Ray awaits an async constructor on the actor's event loop, so the server starts (and, after
    # a restart, starts again) before the actor takes any call.
    async def __init__(self, role: str, settings_json: str) -> None:  # type: ignore[misc]
        settings = Settings.model_validate_json(settings_json)
        self._role = role
        self._settings = settings
        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        self._restarted = bool(context.was_current_actor_reconstructed)
        self._tracer_provider = setup_telemetry(
            f"stratagem-{role}",
            trace_file=settings.trace_file,
            instance_id=f"{role}-{os.getpid()}",
            extra_resource={"stratagem.ray.node_id": self._node_id},
        )
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        for folder in map(str, settings.extension_paths):
            if folder not in sys.path:
                sys.path.append(folder)
        self._store = SqliteStateStore(settings.plans_path(role))
        await self._store.start()
        self._answers = SqliteAnswerStore(
            settings.answers_path(role),
            AnswerRetention(
                max_entries=settings.answer_retention_count,
                max_age_s=settings.answer_retention_s,
            ),
        )
        self._directory = EndpointDirectory(settings.namespace)
        self._dispatcher = GrpcDispatcher(role, self._directory)
        self._agent = build_agent(
            role,
            dispatcher=self._dispatcher,
            engine_config=EngineConfig(max_in_flight=settings.max_in_flight, seed=settings.seed),
            tracer_provider=self._tracer_provider,
            extensions=settings.extensions,
            store=self._store,
        )
        self._audit = SqliteAuditLog(settings.audit_path, synchronous=settings.audit_sync)
        self._node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        host = settings.grpc_host or self._node_ip
        self._server = AgentServer(
            self._agent,
            policy=load_policy(settings),
            audit=self._audit,
            config=ServerConfig(
                host=host,
                port=0,
                max_message_bytes=settings.max_message_bytes,
                default_deadline_s=settings.default_deadline_s,
            ),
            tracer_provider=self._tracer_provider,
            answers=self._answers,
        )
        await self._server.start()
        resumed = await self._agent.resume_unfinished()
        logger.info(
            "agent %s serving on %s (restarted=%s, resumed %d plans)",
            role,
            self._server.endpoint,
            self._restarted,
            len(resumed),
        )

    async def info(self) -> dict[str, Any]:
        """Role, endpoint, node, process and how many plans are running."""
        return {
            "role": self._role,
            "endpoint": self._server.endpoint,
            "node_id": self._node_id,
            "node_ip": self._node_ip,
            "pid": os.getpid(),
            "restarted": self._restarted,
            "plans_running": sum(1 for p in self._agent.plans("") if p.status == "running"),
            "plans_blocked": sum(1 for p in self._agent.plans("") if p.status == "blocked"),
        }

    async def flush(self) -> None:
        """Export every finished span now (the CLI calls this before printing a trace)."""
        await asyncio.to_thread(self._tracer_provider.force_flush, 5_000)

    async def shutdown(self) -> None:
        """Stop serving, close peers' channels and flush spans; the actor can then be killed."""
        await self._server.aclose()
        await self._agent.aclose()
        await self._dispatcher.aclose()
        await self._answers.aclose()
        await self._store.aclose()
        await asyncio.to_thread(shutdown_telemetry)
        self._audit.close()
