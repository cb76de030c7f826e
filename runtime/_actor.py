"""The agent actor: one role agent and its gRPC server in one Ray actor process.

The actor is async: Ray runs its methods on the actor's event loop, the same loop that serves gRPC.
Its constructor builds the agent and starts the server, so when Ray restarts a dead actor
(``max_restarts``) the restarted one serves again on a fresh port and peers find it through the
directory.

Each agent keeps its plans in ``STATE_DIR/<role>.plans.sqlite3`` (a ``planning.SqliteStateStore``)
and its answers to cross-agent requests in ``STATE_DIR/<role>.answers.sqlite3`` (a
``protocol.SqliteAnswerStore``), or both in PostgreSQL when ``STRATAGEM_STORE_URL`` names a
database (see ``runtime._stores``). Every few seconds, and when it shuts down, it signs the audit
chain's head (``protocol.AuditSealer``) with the key the launcher handed it; every few seconds (and
whenever asked for its ``info``) it also checks its stores (``runtime._health``) and reports
``NOT_SERVING`` on the gRPC health service, and the problem in ``info``, while one is broken.

Once serving, the constructor resumes every unfinished plan of the agent from its store, so a
restarted actor continues where its predecessor died: completed steps are skipped, an in-flight
step is re-run only when idempotent (otherwise its plan waits at a reconcile gate for
``stratagem approve|reject``), and a repeated request from a peer gets the stored answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import ray

from stratagem.agents import build_agent, extension_policy_rules
from stratagem.planning import EngineConfig
from stratagem.protocol import (
    AgentServer,
    AuditSealer,
    ClusterSecret,
    Policy,
    ServerConfig,
    load_or_create_key,
)
from stratagem.runtime._directory import EndpointDirectory, GrpcDispatcher, actor_record
from stratagem.runtime._extensions import import_agent_extensions
from stratagem.runtime._health import StoreWatch
from stratagem.runtime._local import publish_endpoint
from stratagem.runtime._mcp import attach_mcp_servers, start_mcp_face
from stratagem.runtime._models import attach_model_planner
from stratagem.runtime._restarts import RestartBudget
from stratagem.runtime._security import authenticator_for, credentials_for
from stratagem.runtime._settings import Settings, settings_digest
from stratagem.runtime._stores import (
    open_answer_store,
    open_audit_heads,
    open_audit_log,
    open_state_store,
    open_world_store,
)
from stratagem.runtime._telemetry import setup_telemetry, shutdown_telemetry

__all__ = ["AgentActor", "load_policy"]

logger = logging.getLogger(__name__)


def load_policy(settings: Settings) -> Policy:
    """The authorization policy: the configured file, or the built-in default, plus the entries
    of the agents the settings' extensions define (imported here, if not yet).

    An extension's entries name only calls to and from its own agent; they are added to a policy
    file of one's own too, since the extension's code runs in every agent anyway.
    """
    import_agent_extensions(settings.extensions)
    base = Policy.load(settings.policy_file) if settings.policy_file else Policy.default()
    added = extension_policy_rules()
    if not added:
        return base
    logger.info("policy: %d entries of the agents extensions define", len(added))
    return Policy([*base.rules, *added])


def _restarts() -> int | None:
    """How often Ray restarted this actor (``None`` if unknown): the runtime context says only
    whether it was restarted; the count is in the GCS actor table."""
    record = actor_record(ray.get_runtime_context().get_actor_id())
    return int(record["NumRestarts"]) if "NumRestarts" in record else None


class AgentActor:
    """Hosts one role agent and serves it over gRPC (used as a Ray actor class)."""

    # Ray awaits an async constructor on the actor's event loop, so the server starts (and, after
    # a restart, starts again) before the actor takes any call.
    async def __init__(  # type: ignore[misc]
        self,
        role: str,
        settings_json: str,
        secret: ClusterSecret | None = None,
        audit_key: bytes | None = None,
        model_api_key: str = "",
    ) -> None:
        settings = Settings.model_validate_json(settings_json)
        self._settings_digest = settings_digest(settings_json)
        self._role = role
        self._settings = settings
        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        self._node_labels = {
            str(key): str(value)
            for key, value in context.get_node_labels().items()
            if not str(key).startswith("ray.io/")
        }
        self._restarted = bool(context.was_current_actor_reconstructed)
        self._restarts: int | None = None
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        budget = RestartBudget(
            settings.restarts_path(role), settings.max_restarts, settings.restart_window_s
        )
        if not self._restarted:
            budget.started()
        elif reason := budget.restarted():
            logger.error("agent %s %s", role, reason)
            ray.actor.exit_actor()  # type: ignore[no-untyped-call]  # for good: not restarted
        self._secret_id = secret.key_id if secret is not None else ""
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
        self._store = await open_state_store(settings, role)
        world = settings.world_path(role) if settings.store_url is None else None
        self._watch = await asyncio.to_thread(StoreWatch, settings, role, world)
        if self._watch.world_lost:
            # Answers stored for calls whose effects on the world are gone must not be replayed
            # as if they still held: set aside, those calls run again.
            await asyncio.to_thread(self._watch.set_aside, settings.answers_path(role))
        self._answers = await open_answer_store(settings, role)
        self._directory = EndpointDirectory(settings.namespace)
        self._dispatcher = GrpcDispatcher(
            role, self._directory, credentials=credentials_for(settings, role, secret)
        )
        self._agent = build_agent(
            role,
            dispatcher=self._dispatcher,
            engine_config=EngineConfig(
                max_in_flight=settings.max_in_flight,
                seed=settings.seed,
                default_timeout_s=settings.effective_step_timeout_s,
            ),
            tracer_provider=self._tracer_provider,
            extensions=settings.extensions,
            store=self._store,
            world_store=open_world_store(settings, role),
        )
        self._audit = open_audit_log(settings)
        policy = load_policy(settings)
        # Before the model planner is made and before any plan resumes: the MCP tools are the
        # agent's tools (in its answer schema too) from its first request on.
        self._mcp = await attach_mcp_servers(self._agent, settings, policy, self._audit)
        attach_model_planner(
            self._agent,
            settings,
            api_key=model_api_key,
            tracer_provider=self._tracer_provider,
        )
        self._sealer = AuditSealer(
            self._audit,
            audit_key or load_or_create_key(settings.audit_key_path),
            open_audit_heads(settings),
        )
        self._sealing = asyncio.create_task(self._seal_periodically())
        self._node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        host = settings.grpc_host or self._node_ip
        self._server = AgentServer(
            self._agent,
            policy=policy,
            authenticator=authenticator_for(settings, role, secret),
            audit=self._audit,
            config=ServerConfig(
                host=host,
                port=settings.ports.get(role, 0),
                max_message_bytes=settings.max_message_bytes,
                default_deadline_s=settings.default_deadline_s,
                max_concurrent_requests=settings.max_concurrent_requests,
                max_queued_requests=settings.max_queued_requests,
                max_watch_streams=settings.max_watch_streams,
                max_delegation_hops=settings.max_delegation_hops,
            ),
            tracer_provider=self._tracer_provider,
            answers=self._answers,
        )
        await self._server.start()
        self._mcp_face = await start_mcp_face(self._server, settings, role)
        try:
            publish_endpoint(settings.state_dir, role, self._server.endpoint, os.getpid())
        except OSError as exc:  # the CLI then finds this agent through Ray, as before
            logger.warning("agent %s could not publish its endpoint: %s", role, exc)
        resumed = await self._agent.resume_unfinished()
        await self._prune()
        logger.info(
            "agent %s serving on %s (restarted=%s, resumed %d plans)",
            role,
            self._server.endpoint,
            self._restarted,
            len(resumed),
        )

    async def _problems(self) -> list[str]:
        """What is wrong with this agent's storage (see ``runtime._health``); the gRPC health
        service says ``NOT_SERVING`` while anything is."""
        problems = await asyncio.to_thread(self._watch.problems, len(self._agent.plans("")))
        await self._server.set_serving(not problems)
        return problems

    async def info(self) -> dict[str, Any]:
        """Role, endpoint, node, process, how many plans are running, and any store problem."""
        problems = await self._problems()
        return {
            "health": "not serving" if problems else "serving",
            "problem": "; ".join(problems),
            "role": self._role,
            "endpoint": self._server.endpoint,
            "node_id": self._node_id,
            "node_ip": self._node_ip,
            "pid": os.getpid(),
            "restarted": self._restarted,
            "plans_running": sum(1 for p in self._agent.plans("") if p.status == "running"),
            "plans_blocked": sum(1 for p in self._agent.plans("") if p.status == "blocked"),
            "restarts": self._restart_count(),
            "node_labels": self._node_labels,
            "settings_digest": self._settings_digest,
            "secret_id": self._secret_id,
            "mcp_url": self._mcp_face.url if self._mcp_face is not None else "",
        }

    def _restart_count(self) -> int | None:
        """This incarnation's restart count: read once from the actor table (it cannot change
        while the process lives), again only while Ray cannot tell."""
        if self._restarts is None:
            self._restarts = _restarts()
        return self._restarts

    async def flush(self) -> None:
        """Export every finished span now and sign the audit chain's head (the CLI calls this
        before it prints a trace and verifies the audit log)."""
        await asyncio.to_thread(self._tracer_provider.force_flush, 5_000)
        await asyncio.to_thread(self._sealer.seal)

    async def _seal_periodically(self) -> None:
        """Sign the audit chain's head every few seconds while records arrive (see
        ``protocol.AuditSealer``); a failed seal is logged and tried again."""
        ticks = 0
        while True:
            await asyncio.sleep(1.0)
            ticks += 1
            if ticks % 5 == 0:
                try:
                    await self._problems()
                except Exception:
                    logger.exception("cannot check the agent's stores")
            try:
                await asyncio.to_thread(self._sealer.maybe_seal, 0)
            except Exception:
                logger.exception("cannot seal the audit log's head")
            if ticks % 60 == 0:
                await self._prune()

    async def _prune(self) -> None:
        """Apply the history's retention (``history_days``, ``history_plans``) to the store; a
        failure is logged and tried again at the next tick."""
        settings = self._settings
        if settings.history_days is None and settings.history_plans is None:
            return
        try:
            await self._agent.prune_history(
                older_than_s=None
                if settings.history_days is None
                else settings.history_days * 86400,
                keep=settings.history_plans,
            )
        except Exception:
            logger.exception("cannot apply the history's retention")

    async def shutdown(self) -> None:
        """Stop serving, close peers' channels and flush spans; the actor can then be killed."""
        if self._mcp_face is not None:
            await self._mcp_face.aclose()
        await self._server.aclose()
        self._sealing.cancel()
        await asyncio.to_thread(self._sealer.seal)
        await self._agent.aclose()
        for toolset in self._mcp:
            await toolset.aclose()
        await self._dispatcher.aclose()
        await self._answers.aclose()
        await self._store.aclose()
        await asyncio.to_thread(shutdown_telemetry)
        self._audit.close()
