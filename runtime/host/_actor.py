"""The agent actor: one role agent and its wire faces (gRPC, A2A, MCP) in one Ray actor process.

The actor is async: Ray runs its methods on the actor's event loop, the same loop that serves gRPC.
Its constructor builds the agent and starts the server, so when Ray restarts a dead actor
(``max_restarts``) the restarted one serves again on a fresh port and peers find it through the
directory.

Each agent keeps its plans in ``STATE_DIR/<role>.plans.sqlite3`` (a ``planning.SqliteStateStore``)
and its answers to cross-agent requests in ``STATE_DIR/<role>.answers.sqlite3`` (a
``protocol.SqliteAnswerStore``), or both in PostgreSQL when ``STRATAGEM_STORE_URL`` names a database
(see ``runtime.config._stores``). Every few seconds, and when it shuts down, it signs the audit
chain's head (``protocol.AuditSealer``) with the key the launcher handed it; every few seconds (and
whenever asked for its ``info``) it also checks its stores (``runtime.host._health``) and reports
``NOT_SERVING`` on the gRPC health service, and the problem in ``info``, while one is broken.

Its wire faces are the rows of ``protocol.FACES``, started in order by ``runtime._faces`` from
the settings: the gRPC server first, then A2A (``protocol.A2AServer``: its card and JSON-RPC over
HTTP, on loopback unless ``STRATAGEM_A2A_HOST`` says otherwise, each request served through the
gRPC server's pipeline; not in ``mtls`` mode) and MCP where ``mcp_ports`` asks; ``info`` names
their URLs (``a2a_url``, ``mcp_url``).

Gate notices (``runtime.host._notify``) wait in ``STATE_DIR/<role>.notices.sqlite3``: each is
audited once, and sent to ``STRATAGEM_GATE_WEBHOOK_URL`` (signed) until delivered.

Once serving, the constructor resumes every unfinished plan of the agent from its store, so a
restarted actor continues where its predecessor died: completed steps are skipped, an in-flight
step is re-run only when idempotent (otherwise its plan waits at a reconcile gate for
``stratagem approve|reject``), and a repeated request from a peer gets the stored answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

import ray

from stratagem.agents import attach_artifact_tools, build_agent, extension_policy_rules
from stratagem.planning import Dispatcher, EngineConfig
from stratagem.protocol import (
    FACES,
    AgentServer,
    AuditSealer,
    ClusterSecret,
    Policy,
    ServerConfig,
    load_or_create_key,
)
from stratagem.runtime.config._artifacts import open_artifact_store
from stratagem.runtime.config._extensions import import_agent_extensions
from stratagem.runtime.config._restarts import RestartBudget
from stratagem.runtime.config._security import authenticator_for, credentials_for
from stratagem.runtime.config._settings import Settings, settings_digest
from stratagem.runtime.config._statedir import private_dir
from stratagem.runtime.config._stores import (
    open_answer_store,
    open_audit_heads,
    open_audit_log,
    open_state_store,
    open_world_store,
)
from stratagem.runtime.host._artifacts import ArtifactHousekeeping
from stratagem.runtime.host._directory import EndpointDirectory, GrpcDispatcher, actor_record
from stratagem.runtime.host._faces import close_faces, face_settings, start_faces
from stratagem.runtime.host._health import StoreWatch
from stratagem.runtime.host._heap import freeze_startup_heap
from stratagem.runtime.host._local import own_log_files, publish_endpoint
from stratagem.runtime.host._mcp import attach_mcp_servers
from stratagem.runtime.host._memory import attach_memory
from stratagem.runtime.host._models import attach_model_planner, model_client
from stratagem.runtime.host._notify import GateOutbox, WebhookSender
from stratagem.runtime.host._research import bind_research_tools
from stratagem.runtime.telemetry._telemetry import (
    export_stats,
    flush_spans,
    setup_telemetry,
    shutdown_telemetry,
)

__all__ = ["AgentActor", "load_policy"]

logger = logging.getLogger(__name__)


def load_policy(settings: Settings) -> Policy:
    """The authorization policy: the configured file, or the built-in default, plus the entries
    of the agents the settings' extensions define (imported here, if not yet).

    An extension's entries name only calls to and from its own agent; they are added to a policy
    file of one's own too, since the extension's code runs in every agent anyway.
    """
    import_agent_extensions(settings.extensions, settings.extension_paths)
    base = Policy.load(settings.policy_file) if settings.policy_file else Policy.default()
    added = extension_policy_rules()
    if not added:
        return base
    logger.info("policy: %d entries of the agents extensions define", len(added))
    return base.extended(added)


class _AgentLog(logging.StreamHandler):  # type: ignore[type-arg]
    """Stratagem's records, to the agent process's standard error."""


def _log_to_stderr(level: str) -> None:
    """Stratagem's loggers write to this process's standard error (a Ray worker's ``.err`` log:
    ``stratagem logs AGENT``) from ``level`` up."""
    root = logging.getLogger("stratagem")
    if not any(isinstance(handler, _AgentLog) for handler in root.handlers):
        handler = _AgentLog(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)


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
        a2a_tokens: dict[str, str] | None = None,
        resume: bool = True,
    ) -> None:
        settings = Settings.model_validate_json(settings_json)
        _log_to_stderr(settings.log_level or "INFO")
        self._settings_digest = settings_digest(settings_json)
        self._role = role
        self._settings = settings
        self._find_placement()
        private_dir(settings.state_dir)
        self._keep_restart_budget()
        self._secret_id = secret.key_id if secret is not None else ""
        self._tracer_provider = setup_telemetry(
            f"stratagem-{role}",
            trace_file=settings.trace_file,
            state_dir=settings.state_dir,
            instance_id=f"{role}-{os.getpid()}",
            extra_resource={"stratagem.ray.node_id": self._node_id},
        )
        private_dir(settings.state_dir)
        for folder in map(str, settings.extension_paths):
            if folder not in sys.path:
                sys.path.append(folder)
        await self._open_stores(secret)
        policy = load_policy(settings)
        self._build_agent(policy, a2a_tokens)
        await self._equip_agent(policy, model_api_key)
        self._sealer = AuditSealer(
            self._audit,
            audit_key or load_or_create_key(settings.audit_key_path),
            open_audit_heads(settings),
        )
        self._sealing = asyncio.create_task(self._seal_periodically())
        await self._serve(policy, secret)
        # A restart resumes the plans that still have callers; a first start after `secret
        # rotate` (resume=False) resumes none: their callers went with the agents it replaced.
        resumed = await self._agent.resume_unfinished(resume=resume or self._restarted)
        await self._prune()
        logger.info(
            "agent %s serving on %s (restarted=%s, resumed %d plans)",
            role,
            self._server.endpoint,
            self._restarted,
            len(resumed),
        )

    # The constructor's parts, in the order it runs them.

    def _find_placement(self) -> None:
        """The node this actor runs on, its labels, and whether Ray restarted it."""
        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        self._node_labels = {
            str(key): str(value)
            for key, value in context.get_node_labels().items()
            if not str(key).startswith("ray.io/")
        }
        self._restarted = bool(context.was_current_actor_reconstructed)
        self._restarts: int | None = None

    def _keep_restart_budget(self) -> None:
        """Count this start against the agent's restart budget; a restart past it ends the actor
        for good (Ray does not restart it again)."""
        settings, role = self._settings, self._role
        budget = RestartBudget(
            settings.restarts_path(role), settings.max_restarts, settings.restart_window_s
        )
        if not self._restarted:
            budget.started()
        elif reason := budget.restarted():
            logger.error("agent %s %s", role, reason)
            ray.actor.exit_actor()  # type: ignore[no-untyped-call]  # for good: not restarted

    async def _open_stores(self, secret: ClusterSecret | None) -> None:
        """The plan store and its watch, the answers, the directory of peers and the dispatcher
        that reaches them, the audit log."""
        settings, role = self._settings, self._role
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
        self._audit = open_audit_log(settings)

    def _build_agent(self, policy: Policy, a2a_tokens: dict[str, str] | None) -> None:
        """The role's agent, its calls out going through A2A to the A2A agents it names."""
        settings, role = self._settings, self._role
        dispatcher: Dispatcher = self._dispatcher
        if settings.a2a_agents:
            from stratagem.agents._a2a import A2ADispatcher, peers_from

            dispatcher = A2ADispatcher(
                self._dispatcher,
                caller=role,
                peers=peers_from(settings.a2a_agents, a2a_tokens),
                policy=policy,
                audit=self._audit,
                tracer_provider=self._tracer_provider,
            )
        self._outbound = dispatcher
        self._agent = build_agent(
            role,
            dispatcher=dispatcher,
            engine_config=EngineConfig(
                max_in_flight=settings.max_in_flight,
                seed=settings.seed,
                default_timeout_s=settings.effective_step_timeout_s,
            ),
            tracer_provider=self._tracer_provider,
            extensions=settings.extensions,
            store=self._store,
            world_store=open_world_store(settings, role),
            a2a_agents=list(settings.a2a_agents),  # those a goal may consult (the orchestrator)
        )

    async def _equip_agent(self, policy: Policy, model_api_key: str) -> None:
        """Before any plan resumes: who decides its gates, which tools ask an approval, the
        outbox that keeps (and audits, and sends) what its gates do, its MCP tools and its model
        planner."""
        settings = self._settings
        self._agent.use_policy(policy)
        self._notices = GateOutbox(
            role=self._role,
            path=settings.notices_path(self._role),
            audit=self._audit,
            url=settings.gate_webhook_url,
            key=load_or_create_key(settings.gate_webhook_key_path)
            if settings.gate_webhook_url
            else b"",
            attempts=settings.gate_webhook_attempts,
            timeout_s=settings.gate_webhook_timeout_s,
            send=WebhookSender(settings.gate_webhook_allowed_networks),
        )
        await self._notices.start()
        self._agent.use_notifier(self._notices)
        # Before the model planner is made: the MCP tools are the agent's tools (in its answer
        # schema too) from its first request on.
        self._mcp = await attach_mcp_servers(self._agent, settings, policy, self._audit)
        self._memory = await attach_memory(self._agent, settings, policy, self._audit)
        # hypotheses.* on every agent; research tools (reading within the file scopes) on perception
        research_model = model_client(
            self._role, settings, api_key=model_api_key, tracer_provider=self._tracer_provider
        )
        # Before the research tools: they cache each source as an artifact of its plan.
        self._artifacts = ArtifactHousekeeping(open_artifact_store(settings))
        bind_research_tools(
            self._agent,
            settings,
            self._memory,
            policy,
            research_model,
            self._audit,
            artifacts=self._artifacts.store,
        )
        attach_artifact_tools(self._agent, self._artifacts.store, policy)
        attach_model_planner(
            self._agent,
            settings,
            api_key=model_api_key,
            tracer_provider=self._tracer_provider,
        )

    async def _serve(self, policy: Policy, secret: ClusterSecret | None) -> None:
        """Start every face, gRPC first, and publish the agent's endpoint."""
        settings, role = self._settings, self._role
        self._node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        faces = face_settings(settings, role, self._node_ip)
        grpc = faces["grpc"]
        self._server = AgentServer(
            self._agent,
            policy=policy,
            authenticator=authenticator_for(settings, role, secret),
            audit=self._audit,
            config=ServerConfig(
                host=grpc.host,
                port=grpc.port,
                max_message_bytes=grpc.max_message_bytes,
                default_deadline_s=settings.default_deadline_s,
                max_concurrent_requests=settings.max_concurrent_requests,
                max_queued_requests=settings.max_queued_requests,
                max_watch_streams=settings.max_watch_streams,
                max_delegation_hops=settings.max_delegation_hops,
            ),
            tracer_provider=self._tracer_provider,
            answers=self._answers,
            # A plan store deleted under the agent stops it taking work, instead of plans written
            # to a file no restart reads.
            refusal=self._watch.refusal,
        )
        # What startup made lives as long as the process: out of the collector's full
        # collections from here on (see ``_heap``), before the first call is served.
        freeze_startup_heap()
        # Every face, gRPC first, in ``protocol.FACES``' order; each serves through its pipeline.
        self._faces = await start_faces(self._server, self._agent, faces, role)
        try:
            publish_endpoint(
                settings.state_dir, role, self._server.endpoint, os.getpid(), own_log_files()
            )
        except OSError as exc:  # the CLI then finds this agent through Ray, as before
            logger.warning("agent %s could not publish its endpoint: %s", role, exc)

    async def _problems(self) -> list[str]:
        """What is wrong with this agent's storage (see ``runtime.host._health``); the gRPC health
        service says ``NOT_SERVING`` while anything is."""
        problems = await asyncio.to_thread(self._watch.problems, len(self._agent.plans("")))
        await self._server.set_serving(not problems)
        return problems

    async def info(self) -> dict[str, Any]:
        """Role, endpoint, node, process, how many plans are running, any store problem, and what
        its trace exporter did (``runtime.telemetry._export``)."""
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
            "traces": {} if (stats := export_stats()) is None else dataclasses.asdict(stats),
            "extensions": list(self._settings.extensions),
            "model": self._agent.model,
            **{
                kind.info_key: face.url if (face := self._faces.get(kind.name)) else ""
                for kind in FACES
                if kind.name != "grpc"
            },
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
        await asyncio.to_thread(flush_spans)
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
        await self._artifacts.maybe_run()  # the artifacts' retention, at most once an hour
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
        self._agent.closing()  # calls cut by the stop interrupt their plans, resumed at restart
        await close_faces(self._faces)  # the gRPC server last
        self._sealing.cancel()
        await asyncio.to_thread(self._sealer.seal)
        await self._agent.aclose()
        await self._notices.aclose()
        for toolset in self._mcp:
            await toolset.aclose()
        if self._memory is not None:
            await self._memory.aclose()
        close = getattr(self._outbound, "aclose", None)
        if close is not None:
            await close()  # the A2A dispatcher closes the gRPC one it wraps
        else:
            await self._dispatcher.aclose()
        await self._answers.aclose()
        await self._store.aclose()
        await asyncio.to_thread(shutdown_telemetry)
        self._audit.close()
