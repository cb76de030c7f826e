"""Settings: typed, read from the environment at one edge.

Precedence is argument > environment (``STRATAGEM_*``, plus ``RAY_ADDRESS``) > default. Nothing
reads the environment at import time; ``load_settings`` is the one place that does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from stratagem.protocol import MCP_SERVER_NAME_PATTERN, ROLE_PATTERN, McpServerConfig, roles
from stratagem.runtime.config._a2a_peer import A2APeer
from stratagem.runtime.config._statedir import check_state_dir
from stratagem.runtime.config._tiers import ModelTier, Tier, check_role_tiers

__all__ = ["RolePlacement", "Settings", "load_settings", "settings_digest"]


def _importable(name: str) -> bool:
    """Whether module ``name`` can be imported, without importing it."""
    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_ROLE = re.compile(ROLE_PATTERN)
_MCP_SERVER = re.compile(MCP_SERVER_NAME_PATTERN)


def _role_names(value: Mapping[str, object]) -> None:
    """Refuse a key that cannot be a role; whether it is one is known once the extensions that
    define agents are imported (``load_settings`` checks it then)."""
    for name in sorted(value):
        if not _ROLE.fullmatch(name):
            raise ValueError(f"{name!r} is not a role; roles are: {', '.join(roles())}")


class RolePlacement(BaseModel):
    """Where one role's agent may run in a Ray cluster.

    Attributes:
        resources: Custom Ray resources the agent reserves (a node must offer them, e.g. a node
            started with ``ray start --resources '{"edge": 1}'`` for ``{"edge": 0.01}``).
        labels: Node labels the agent's node must carry (Ray's ``label_selector``: a node started
            with ``ray start --labels zone=b`` matches ``{"zone": "b"}``; Ray's operators such as
            ``"!a"`` or ``"in(a,b)"`` pass through).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    resources: dict[str, float] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if not name or amount <= 0:
                raise ValueError(f"resource {name!r} needs a name and an amount above 0")
            if name in ("CPU", "GPU", "memory"):
                raise ValueError(f"{name} is not a custom resource (see STRATAGEM_ACTOR_CPUS)")
        return value


class ArtifactRetentionSetting(BaseModel):
    """One scope's artifact retention (``STRATAGEM_ARTIFACTS_RETENTION``; ``planning.
    ArtifactRetention``).

    Attributes:
        max_age_s: Versions older than this many seconds are removed.
        max_versions: Only a name's newest this many versions are kept.
        keep_latest: A name's newest version survives the age rule.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_age_s: float | None = Field(default=None, gt=0)
    max_versions: int | None = Field(default=None, ge=1)
    keep_latest: bool = True


class Settings(BaseSettings):
    """Runtime settings. Each field maps to ``STRATAGEM_<FIELD>`` in the environment.

    Attributes:
        state_dir: Directory for SQLite files, the local cluster's address and span files.
        address: Ray cluster address (``auto``, ``HOST:PORT`` or ``ray://HOST:10001``); ``None``
            starts an embedded local Ray in-process (or uses the one ``stratagem up`` started).
        namespace: Ray namespace of the named agent actors.
        grpc_host: Address agents bind their gRPC servers to; ``None`` chooses 127.0.0.1 for an
            embedded Ray and the node's IP on a cluster.
        policy_file: Authorization policy (TOML); ``None`` uses the built-in default policy.
        max_message_bytes: Largest request an agent accepts.
        default_deadline_s: Deadline given to requests that arrive without one.
        request_timeout_s: Deadline the CLI gives its own requests.
        max_restarts: Restarts of a dead agent allowed within ``restart_window_s`` (-1: always;
            0: never); beyond that the agent gives up (``runtime.config._restarts``).
        restart_window_s: The window ``max_restarts`` counts in, seconds.
        max_in_flight: Steps an agent's engine runs at once.
        seed: Seed of the engines' retry jitter.
        extensions: User modules (``module`` or ``module:function``) loaded into every agent;
            a module may define agents of its own (``agents.define_agent``).
        extension_import_timeout_s: How long a command may take to import the extensions (it
            imports them before anything starts); one whose import takes longer is refused in
            one line naming it.
        research_scopes: The folders research goals may read sources under (the file scopes);
            empty: the folder holding a ``.stratagem`` state directory, else the current folder.
        extension_paths: Folders agents add to ``sys.path`` before loading extensions; a local
            deployment adds the folder it was launched from.
        trace_file: JSON-lines file every process appends its finished spans to; ``None`` for
            none. The CLI reads it to print a goal's span tree.
        actor_cpus: CPUs each agent actor reserves (0 lets four agents share a small machine).
        audit_sync: How hard audit commits are pushed to disk: ``normal`` (a killed process
            loses no committed record; an OS crash or power loss may lose the last ones) or
            ``full`` (an fsync per commit). See ``protocol.SqliteAuditLog``.
        answer_retention_count: How many answers to cross-agent requests each agent keeps (by
            caller and request id) so a repeated request gets the stored answer.
        answer_retention_s: How long (seconds) such answers are kept; a request repeated later
            runs its handler again, so this must outlast a caller's retries and resumes.
        history_days: Each agent deletes finished plans older than this many days from its
            store (checked at start and every minute); ``None`` keeps them. Unfinished plans are
            always kept.
        history_plans: Each agent keeps at most this many finished plans in its store, deleting
            the oldest; ``None`` keeps them all.
        store_url: Where agents keep plans, answers and the audit log: ``None`` for SQLite files
            in ``state_dir`` (the embedded default), or ``postgresql://USER@HOST:PORT/DB`` for a
            PostgreSQL server every node reaches (needed when agents move between nodes).
        artifacts_s3_url: Where artifact blobs go instead of ``STATE_DIR/artifacts/blobs``:
            ``http(s)://HOST[:PORT]/BUCKET[/PREFIX]`` of an S3-compatible object store
            (``docs/artifacts-memory.md``).
        artifacts_s3_credentials_file: A file of two lines, the access key and the secret key,
            for ``artifacts_s3_url`` (read when the store opens; keep it mode 0600).
        artifacts_s3_region: The region requests to ``artifacts_s3_url`` are signed for.
        artifacts_retention: Per scope (``plan``, ``goal``, ``agent``, ``deployment``), how long
            its artifacts are kept; the agents apply it, and sweep blobs no record names, at
            start and every hour. A scope not named keeps everything.
        auth: How agents and clients prove who they are: ``token`` (signed tokens from the
            cluster secret in ``state_dir``), ``mtls`` (a certificate per identity from
            ``stratagem certs init``) or ``none`` (the caller metadata is trusted; tests only).
        audit_key_file: The key that signs the audit chain's heads; ``None`` for
            ``STATE_DIR/audit.key``. Keep it apart from the log (another volume, a secret store's
            mount): whoever can write both can rewrite the chain and sign it again.
        audit_heads_copy: A second append-only file every signed head is also written to (on
            another disk, or a mount the state dir's writers cannot rewrite); ``None``: none.
        secret_file: The cluster secret every identity's token key is derived from; ``None``
            for ``state_dir/cluster.secret``.
        operator_key_file: The operator's own token key (``protocol.IdentityKey``), which signs
            only as the operator; ``None`` for ``state_dir/operator.key``. An operator on another
            machine points it at a copy.
        token_ttl_s: How long a signed token is valid; clients renew theirs before it expires.
        tls_dir: Where ``stratagem certs init`` writes the CA, certificates and keys for ``mtls``;
            ``None`` for ``state_dir/tls``.
        max_concurrent_requests: Requests an agent serves at once.
        max_queued_requests: Requests an agent queues beyond those; more are refused at once
            with ``RESOURCE_EXHAUSTED``.
        max_watch_streams: Watch streams an agent keeps open at once; more are refused at once
            (``RESOURCE_EXHAUSTED``).
        max_delegation_hops: The longest delegation chain (who asked on whose behalf) accepted.
        placement: Per role, the Ray resources or node labels its agent's node must have (JSON
            in ``STRATAGEM_PLACEMENT``, e.g. ``{"perception": {"labels": {"zone": "b"}}}``); a role
            not named runs wherever Ray puts it. A restarted agent lands on a node that matches.
            ``ports``, ``planners`` and ``placement`` may name the roles of agents the
            ``extensions`` define (``load_settings`` imports them to know those roles).
        deploy_timeout_s: How long ``stratagem up`` waits for every agent to serve (longer on a
            cluster whose nodes start on demand); agents still starting then are reported.
        allow_unauthenticated_ray: Deploy onto an external Ray cluster that is not on loopback
            and asks for no Ray token (anyone who reaches it can run code in the agents); refused
            unless set, and then warned about.
        ports: Per role, a fixed port its gRPC server binds (JSON in ``STRATAGEM_PORTS``, e.g.
            ``{"perception": 50051}``: for firewalls and Kubernetes Services); a role not named
            gets a free port.
        a2a: Whether every agent also serves A2A (its card and JSON-RPC over HTTP, beside its
            gRPC server; not in ``mtls`` mode, whose identities are certificates).
        a2a_host: The address agents bind their A2A servers to: loopback unless set.
        a2a_ports: Per role, a fixed port its A2A server binds (JSON in ``STRATAGEM_A2A_PORTS``, as
            ``ports``); a role not named gets a free port.
        a2a_task_deadline_s: How long an A2A task sent with ``returnImmediately`` may run (its
            call's deadline; a caller that waits for the answer gets ``default_deadline_s``).
        a2a_agents: External A2A agents plans may call, by the name a cross-agent step's
            ``agent`` gives them (JSON in ``STRATAGEM_A2A_AGENTS``, e.g.
            ``{"echo": {"url": "http://127.0.0.1:9999/", "token": "..."}}``); each may be named
            in a step as ``a2a:NAME``. The token is a secret (never logged, traced or audited).
        planner: How every agent plans: ``deterministic`` (its own rules) or ``model`` (a
            language model, checked by its rules; see ``agents.ModelPlanner``).
        planners: Per role, a choice other than ``planner`` (JSON in ``STRATAGEM_PLANNERS``, e.g.
            ``{"tactical": "model"}``).
        memory_embeddings_url: The OpenAI-compatible base URL (``.../v1``) whose ``/embeddings``
            memory asks for vectors; ``None``: memory recalls by full text only
            (``docs/artifacts-memory.md``).
        memory_embeddings_model: The embeddings model's name at that server.
        model_url: The OpenAI-compatible base URL of the model server; ``None``: the embedded one
            ``make model-server`` started, when it answers.
        model: The model's name at that server: the ``default`` tier's model.
        model_tiers: The ``weak`` and ``strong`` tiers' models (JSON in ``STRATAGEM_MODEL_TIERS``,
            a name or ``{"model": ..., "url": ...}`` each; ``runtime.config._tiers``).
        role_tiers: Per role, its tier (JSON in ``STRATAGEM_ROLE_TIERS``, e.g.
            ``{"orchestrator": "strong"}``); a role not named is on ``default``.
        model_api_key: The key for that server: a secret (never logged, traced or audited; it
            reaches the agents as a constructor argument, not in the settings they are given).
        model_timeout_s: How long one model call may take once sent, first byte to last (its
            wait for a turn at the server is bounded by the caller's deadline instead).
        model_max_repairs: New attempts after a model's plan is refused (or fails while running).
        model_max_tokens: The most tokens one model answer may have.
        model_token_budget: Tokens the model calls of one plan may use; ``None``: no limit.
        model_schema_style: How the server takes a JSON Schema: ``json_schema`` (OpenAI, vLLM,
            Ollama, LM Studio), ``json_object`` (llama.cpp's Python server) or ``text`` (the
            schema in the prompt): the form asked first, a refused one is followed by the next.
        step_timeout_s: The limit on one attempt of a plan step without its own (a cross-agent
            request included); ``None``: 30 s, or 600 s when any role plans with a model (a small
            model on a CPU takes tens of seconds a call).
        model_max_concurrent: Model calls the server is given at once by all the agents of a
            node together (one queue per server, in the state directory); ``None``: 1 for the
            embedded server (a CPU answers one at a time), 4 otherwise.
        mcp_servers: MCP servers whose tools become tools of an agent, by server name (JSON in
            ``STRATAGEM_MCP_SERVERS``, or ``[default.mcp_servers.NAME]`` tables in the config
            file; see ``protocol.McpServerConfig`` and docs/mcp.md). The policy decides which of
            their tools each agent may use (rules with target ``mcp.NAME``).
        mcp_ports: Per role, the loopback port of that agent's MCP face (its capabilities as
            MCP tools over Streamable HTTP, behind the same authentication, policy and audit as
            a gRPC call; 0 picks a free port). Off for a role not named (JSON in
            ``STRATAGEM_MCP_PORTS``, e.g. ``{"tactical": 0}``).
        genai_capture_content: Whether model prompts and answers go on spans (OpenTelemetry's
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``); off by default.
        gate_webhook_url: Where each agent POSTs a notice when a gate of its plans opens,
            escalates or times out (``http://`` or ``https://``; unset: no webhook). The body is
            signed (HMAC-SHA256, docs/gates.md); notices wait in the agent's outbox
            (``STATE_DIR/<role>.notices.sqlite3``) until delivered, across restarts.
        gate_webhook_key_file: The webhook's signing key (else ``STATE_DIR/gate-webhook.key``,
            made on first use, mode 0600); the receiver checks signatures with it.
        gate_webhook_attempts: Deliveries tried per notice before it is given up (logged).
        gate_webhook_timeout_s: How long one delivery may take, as a whole (name lookup,
            connection, request and the answer's status line).
        gate_webhook_allowed_networks: Networks of internal addresses (loopback, private,
            link-local...) the webhook may still be sent to (comma-separated CIDRs in the
            environment, e.g. ``127.0.0.1/32``); a host resolving to any other internal address
            is refused, never sent to.
        log_level: How much Stratagem logs: an agent (``None``: ``INFO``, to its Ray worker log,
            which ``stratagem logs AGENT`` prints) and the CLI (``None``: ``ERROR``; the CLI
            reads ``STRATAGEM_LOG_LEVEL`` itself, before any setting).
    """

    # model_url, model_* are settings, not pydantic API: no protected "model_" namespace here.
    model_config = SettingsConfigDict(
        env_prefix="STRATAGEM_", extra="ignore", protected_namespaces=()
    )

    state_dir: Path = Path(".stratagem")
    address: str | None = None
    namespace: str = "stratagem"
    grpc_host: str | None = None
    policy_file: Path | None = None
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    default_deadline_s: float = Field(default=30.0, gt=0, le=3600)
    request_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    max_restarts: int = Field(default=5, ge=-1)
    restart_window_s: float = Field(default=600.0, gt=0, le=30 * 86400)
    max_in_flight: int = Field(default=4, ge=1, le=256)
    seed: int = 0
    extensions: Annotated[list[str], NoDecode] = Field(default_factory=list)
    extension_import_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    extension_paths: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    research_scopes: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    trace_file: Path | None = None
    actor_cpus: float = Field(default=0.0, ge=0)
    audit_sync: Literal["normal", "full"] = "normal"
    answer_retention_count: int = Field(default=100_000, ge=0)
    answer_retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    history_days: float | None = Field(default=None, gt=0, le=36500)
    history_plans: int | None = Field(default=None, ge=1)
    store_url: str | None = None
    artifacts_s3_url: str | None = None
    artifacts_s3_credentials_file: Path | None = None
    artifacts_s3_region: str = "us-east-1"
    artifacts_retention: dict[
        Literal["plan", "goal", "agent", "deployment"], ArtifactRetentionSetting
    ] = Field(default_factory=dict)
    auth: Literal["token", "mtls", "none"] = "token"
    audit_key_file: Path | None = None
    audit_heads_copy: Path | None = None
    secret_file: Path | None = None
    operator_key_file: Path | None = None
    token_ttl_s: float = Field(default=3600.0, ge=10, le=30 * 24 * 3600)
    tls_dir: Path | None = None
    max_concurrent_requests: int = Field(default=64, ge=1, le=100_000)
    max_queued_requests: int = Field(default=256, ge=0, le=1_000_000)
    max_watch_streams: int = Field(default=1024, ge=1, le=1_000_000)
    max_delegation_hops: int = Field(default=8, ge=1, le=64)
    placement: dict[str, RolePlacement] = Field(default_factory=dict)
    ports: dict[str, int] = Field(default_factory=dict)
    a2a: bool = True
    a2a_host: str = "127.0.0.1"
    a2a_ports: dict[str, int] = Field(default_factory=dict)
    a2a_task_deadline_s: float = Field(default=3600.0, gt=0, le=7 * 86400)
    a2a_agents: dict[str, A2APeer] = Field(default_factory=dict)
    planner: Literal["deterministic", "model"] = "deterministic"
    planners: dict[str, Literal["deterministic", "model"]] = Field(default_factory=dict)
    memory_embeddings_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    memory_embeddings_model: str = Field(default="default", min_length=1, max_length=200)
    model_url: str | None = None
    model: str = ""
    model_tiers: dict[Literal["weak", "strong"], ModelTier] = Field(default_factory=dict)
    role_tiers: dict[str, Tier] = Field(default_factory=dict)
    model_api_key: SecretStr | None = Field(default=None, exclude=True)
    model_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    model_max_repairs: int = Field(default=2, ge=0, le=10)
    model_max_tokens: int = Field(default=512, ge=1, le=32768)
    model_token_budget: int | None = Field(default=None, ge=0)
    model_schema_style: Literal["json_schema", "json_object", "text"] = "json_schema"
    model_max_concurrent: int | None = Field(default=None, ge=1, le=256)
    step_timeout_s: float | None = Field(default=None, gt=0, le=86400)
    genai_capture_content: bool = Field(
        default=False,
        validation_alias=AliasChoices(
            "genai_capture_content",
            "STRATAGEM_GENAI_CAPTURE_CONTENT",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        ),
    )
    deploy_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    allow_unauthenticated_ray: bool = False
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    mcp_ports: dict[str, int] = Field(default_factory=dict)
    gate_webhook_url: str | None = None
    gate_webhook_key_file: Path | None = None
    gate_webhook_attempts: int = Field(default=20, ge=1, le=1000)
    gate_webhook_timeout_s: float = Field(default=10.0, gt=0, le=600)
    gate_webhook_allowed_networks: Annotated[
        list[ipaddress.IPv4Network | ipaddress.IPv6Network], NoDecode
    ] = Field(default_factory=list)

    @field_validator("gate_webhook_allowed_networks", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            return value
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in value:
            try:
                networks.append(ipaddress.ip_network(str(item).strip(), strict=False))
            except ValueError:
                raise ValueError(
                    f"{str(item)[:64]!r} is not a network (a CIDR such as 127.0.0.1/32)"
                ) from None
        return networks

    @field_validator("gate_webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("extensions", "extension_paths", "research_scopes", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        # Accept "a,b:setup" from the environment as well as a JSON list.
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("ports", "a2a_ports")
    @classmethod
    def _port_roles(cls, value: dict[str, int]) -> dict[str, int]:
        _role_names(value)
        bad = sorted(role for role, port in value.items() if not 1 <= port <= 65535)
        if bad:
            raise ValueError(f"the port of {bad[0]} must be in 1..65535, not {value[bad[0]]}")
        taken = [port for port in value.values() if list(value.values()).count(port) > 1]
        if taken:
            raise ValueError(f"port {taken[0]} is given to more than one role")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_server_names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in sorted(value):
            if not _MCP_SERVER.fullmatch(name):
                raise ValueError(
                    f"MCP server name {name!r} must match {MCP_SERVER_NAME_PATTERN} (lowercase)"
                )
        return value

    @field_validator("mcp_ports")
    @classmethod
    def _mcp_port_roles(cls, value: dict[str, int]) -> dict[str, int]:
        _role_names(value)
        bad = sorted(role for role, port in value.items() if not 0 <= port <= 65535)
        if bad:
            raise ValueError(f"the MCP port of {bad[0]} must be in 0..65535, not {value[bad[0]]}")
        return value

    @field_validator("planners")
    @classmethod
    def _planner_roles(cls, value: dict[str, str]) -> dict[str, str]:
        _role_names(value)
        return value

    @field_validator("role_tiers")
    @classmethod
    def _role_tiers(cls, value: dict[str, Tier], info: ValidationInfo) -> dict[str, Tier]:
        _role_names(value)
        check_role_tiers(value, info.data.get("model_tiers", {}))
        return value

    @field_validator("model_url")
    @classmethod
    def _model_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (the server's /v1 base)")
        return value

    def planner_for(self, role: str) -> Literal["deterministic", "model"]:
        """How ``role``'s agent plans."""
        return self.planners.get(role, self.planner)

    def planning_timeout_s(self, role: str) -> float:
        """The longest ``role``'s agent may take to plan one request: with a model, its first
        call and each repair, each within ``model_timeout_s``; 0 when it plans with its rules.
        What the agent's card says (``AgentCard.planning_timeout_s``) and what a goal's default
        deadline adds for each request a goal makes the agent plan."""
        if self.planner_for(role) != "model":
            return 0.0
        return (1 + self.model_max_repairs) * self.model_timeout_s

    @property
    def plans_with_a_model(self) -> bool:
        """Whether any role plans with a model."""
        return "model" in (self.planner, *self.planners.values())

    @property
    def effective_step_timeout_s(self) -> float:
        """``step_timeout_s``, or its default (longer when a model plans)."""
        if self.step_timeout_s is not None:
            return self.step_timeout_s
        return 600.0 if self.plans_with_a_model else 30.0

    @field_validator("placement")
    @classmethod
    def _placement_roles(cls, value: dict[str, RolePlacement]) -> dict[str, RolePlacement]:
        _role_names(value)
        return value

    def unknown_roles(self, known: Collection[str]) -> list[tuple[str, str]]:
        """The ``(setting, role)`` pairs of ``ports``, ``planners``, ``role_tiers``, ``placement``,
        ``mcp_ports`` and ``mcp_servers`` (their ``agent``) that name a role outside ``known``."""
        return [
            (setting, role)
            for setting, value in (
                ("ports", self.ports),
                ("a2a_ports", self.a2a_ports),
                ("planners", self.planners),
                ("role_tiers", self.role_tiers),
                ("placement", self.placement),
                ("mcp_ports", self.mcp_ports),
                ("mcp_servers", {c.agent: c for c in self.mcp_servers.values()}),
            )
            for role in sorted(value)
            if role not in known
        ]

    @field_validator("store_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL (leave it unset for SQLite files)")
        missing = [name for name in ("psycopg", "psycopg_pool") if not _importable(name)]
        if missing:
            raise ValueError(
                f"PostgreSQL needs {' and '.join(missing)}, which are not installed: "
                "pip install 'stratagem[postgres]' (and 'psycopg[binary]' where libpq is missing)"
            )
        return value

    @field_validator(
        "state_dir",
        "policy_file",
        "trace_file",
        "tls_dir",
        "secret_file",
        "operator_key_file",
        "audit_key_file",
        "audit_heads_copy",
        "gate_webhook_key_file",
    )
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Actors run with another working directory: hand them absolute paths.
        return None if value is None else value.expanduser().resolve()

    @property
    def audit_path(self) -> Path:
        """The audit log's SQLite file."""
        return self.state_dir / "audit.sqlite3"

    @property
    def research_roots(self) -> list[Path]:
        """The folders research goals may read under: ``research_scopes``, else the folder that
        holds a ``.stratagem`` state directory (a project's), else the current folder (a local
        deployment gives its agents the folder it was launched from)."""
        if self.research_scopes:
            return [path.resolve() for path in self.research_scopes]
        state = self.state_dir.resolve()
        return [state.parent] if state.name == ".stratagem" else [Path.cwd()]

    @property
    def research_dir(self) -> Path:
        """Where the perception agent caches research sources and its fetch ledger."""
        return self.state_dir / "research"

    @property
    def memory_path(self) -> Path:
        """The deployment's memory, a SQLite file (``docs/artifacts-memory.md``)."""
        return self.state_dir / "memory.sqlite3"

    def world_path(self, role: str) -> Path:
        """Where ``role``'s agent keeps its world model (the perception agent's), a JSON file."""
        return self.state_dir / f"{role}.world.json"

    def plans_path(self, role: str) -> Path:
        """The SQLite state store of ``role``'s agent (its durable plans)."""
        return self.state_dir / f"{role}.plans.sqlite3"

    @property
    def audit_key_path(self) -> Path:
        """The key that signs the audit chain's heads (outside the database, mode 0600):
        ``audit_key_file``, else ``STATE_DIR/audit.key``."""
        return self.audit_key_file or self.state_dir / "audit.key"

    @property
    def audit_archive_dir(self) -> Path:
        """Where ``stratagem audit archive`` puts old audit records, and ``verify`` reads them."""
        return self.state_dir / "audit-archive"

    @property
    def audit_heads_path(self) -> Path:
        """The append-only file of the audit chain's signed heads."""
        return self.state_dir / "audit.heads"

    def notices_path(self, role: str) -> Path:
        """The outbox of ``role``'s agent: its gate notices until the webhook took them."""
        return self.state_dir / f"{role}.notices.sqlite3"

    @property
    def gate_webhook_key_path(self) -> Path:
        """The key that signs gate webhooks: ``gate_webhook_key_file``, else
        ``STATE_DIR/gate-webhook.key`` (made on first use, mode 0600)."""
        return self.gate_webhook_key_file or self.state_dir / "gate-webhook.key"

    def restarts_path(self, role: str) -> Path:
        """Where ``role``'s agent counts its recent restarts (``runtime.config._restarts``)."""
        return self.state_dir / f"{role}.restarts.json"

    def answers_path(self, role: str) -> Path:
        """The SQLite answer store of ``role``'s agent (answers by caller and request id)."""
        return self.state_dir / f"{role}.answers.sqlite3"

    @property
    def secret_path(self) -> Path:
        """The cluster secret that signs tokens (created on first start, mode 0600)."""
        return self.secret_file or self.state_dir / "cluster.secret"

    @property
    def operator_key_path(self) -> Path:
        """The operator's token key (written by what deploys, mode 0600)."""
        return self.operator_key_file or self.state_dir / "operator.key"

    @property
    def tls_path(self) -> Path:
        """The folder of the CA, certificates and keys for ``auth=mtls``."""
        return self.tls_dir or self.state_dir / "tls"

    @property
    def ray_token_path(self) -> Path:
        """The Ray token of the local head ``stratagem up`` starts (mode 0600)."""
        return self.state_dir / "ray.token"

    @property
    def local_cluster_file(self) -> Path:
        """Where ``stratagem up`` records the local Ray head it started."""
        return self.state_dir / "local-ray.json"


CONFIG_ENV = "STRATAGEM_CONFIG"
"""The variable naming the config file (default ``$XDG_CONFIG_HOME/stratagem/config.toml``)."""
PROFILE_ENV = "STRATAGEM_PROFILE"
"""The variable naming the config file's profile to use (``--profile`` on the command line)."""
STATE_DIR_NAME = ".stratagem"
_MAX_CONFIG_BYTES = 1 << 20


def config_path() -> Path:
    """Where the optional config file is: ``STRATAGEM_CONFIG``, else the user's config folder."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "stratagem" / "config.toml"


def default_state_dir(cwd: Path | None = None) -> Path:
    """The state directory when no flag, variable or profile names one.

    The nearest ``.stratagem`` folder in ``cwd`` or a folder above it (a deployment made from a
    project folder, as ``stratagem up`` there makes one), else the user's own,
    ``$XDG_STATE_HOME/stratagem`` (``~/.local/state/stratagem``): the same from any folder.
    """
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / STATE_DIR_NAME
        if candidate.is_dir():
            return candidate
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stratagem"


def profile_values(profile: str | None) -> dict[str, Any]:
    """The settings the config file gives: its ``[default]`` table, then ``[profiles.NAME]``.

    Raises:
        SettingsError: The file cannot be read or parsed, names an unknown setting, or has no
            profile ``profile`` (the message lists the valid ones).
    """
    path = config_path()
    if not path.is_file():
        if profile:
            raise SettingsError(f"no config file {path} for profile {profile!r}")
        return {}
    try:
        with path.open("rb") as handle:
            raw = handle.read(_MAX_CONFIG_BYTES + 1)
        if len(raw) > _MAX_CONFIG_BYTES:
            raise SettingsError(f"config file {path} is over {_MAX_CONFIG_BYTES} bytes")
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from exc
    extra = sorted(set(data) - {"default", "profiles"})
    if extra:
        raise SettingsError(
            f"config file {path}: unknown table {extra[0]!r}; valid: default, profiles"
        )
    tables = [("default", data.get("default", {}))]
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise SettingsError(f"config file {path}: profiles must be a table of tables")
    if profile:
        if profile not in profiles:
            valid = ", ".join(sorted(profiles)) or "none defined"
            raise SettingsError(f"config file {path} has no profile {profile!r}; valid: {valid}")
        tables.append((f"profiles.{profile}", profiles[profile]))
    values: dict[str, Any] = {}
    for name, table in tables:
        if not isinstance(table, dict):
            raise SettingsError(f"config file {path}: [{name}] must be a table of settings")
        values.update(table)
    unknown = sorted(set(values) - set(Settings.model_fields))
    if unknown:
        raise SettingsError(
            f"config file {path}: unknown setting {unknown[0]!r}; valid: "
            + ", ".join(sorted(Settings.model_fields))
        )
    return values


def load_settings(*, profile: str | None = None, **overrides: Any) -> Settings:
    """Build settings: ``overrides`` (arguments; ``None`` values ignored) > environment
    (``STRATAGEM_*``) > the config file's profile > defaults.

    The profile is ``profile``, else ``STRATAGEM_PROFILE``; the config file's ``[default]`` table
    applies with or without one. The state directory, when nothing names it, is
    :func:`default_state_dir`. The extensions, when nothing names them, are those ``stratagem up``
    recorded in the state directory (``runtime.config._deployed``). ``RAY_ADDRESS`` is honoured when
    neither an argument nor ``STRATAGEM_ADDRESS`` (nor the profile) gives an address.

    Raises:
        pydantic.ValidationError: A value is outside its constraints.
        SettingsError: A ``STRATAGEM_*`` value is not the JSON it must be, or the config file is
            wrong (see :func:`profile_values`).
        StateDirError: The state directory is not this user's alone (``runtime.config._statedir``).
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    settings = Settings(**given)
    chosen = profile or os.environ.get(PROFILE_ENV) or None
    from_file = {
        key: value
        for key, value in profile_values(chosen).items()
        if key not in settings.model_fields_set
    }
    if "state_dir" not in settings.model_fields_set and "state_dir" not in from_file:
        from_file["state_dir"] = default_state_dir()
    settings = Settings(**given, **from_file)
    check_state_dir(settings.state_dir)  # before any file in it is read
    _check_mcp_folders(settings)
    if "extensions" not in settings.model_fields_set:
        settings = _with_recorded_extensions(settings, given, from_file)
    if settings.address is None and os.environ.get("RAY_ADDRESS"):
        settings = settings.model_copy(update={"address": os.environ["RAY_ADDRESS"]})
    _check_roles(settings)
    return settings


def _with_recorded_extensions(
    settings: Settings, given: dict[str, Any], from_file: dict[str, Any]
) -> Settings:
    """``settings`` with the extensions ``stratagem up`` recorded in their state directory (and
    the folders they come from) when nothing else named any (``runtime.config._deployed``)."""
    from stratagem.runtime.config._deployed import read_record

    record = read_record(settings.state_dir)
    if record is None or not record.extensions:
        return settings
    paths = [*settings.extension_paths]
    paths += [path for path in record.extension_paths if path not in paths]
    values = {**given, **from_file, "extensions": list(record.extensions), "extension_paths": paths}
    return Settings(**values)


def _check_mcp_folders(settings: Settings) -> None:
    """Refuse a stdio MCP server whose working directory is in the state directory, where the
    agents' secrets are (``docs/mcp.md``, "Trust boundary").

    Raises:
        SettingsError: The first such server, named.
    """
    state = settings.state_dir.expanduser().resolve()
    for name, server in settings.mcp_servers.items():
        if server.cwd is None:
            continue
        cwd = server.cwd.expanduser().resolve()
        if cwd == state or state in cwd.parents:
            raise SettingsError(
                f"mcp_servers.{name}.cwd: {server.cwd} is in the state directory {state}, "
                "whose secrets an MCP server must not reach; give the server a folder of its own"
            )


def _check_roles(settings: Settings) -> None:
    """Refuse ``ports``, ``planners`` or ``placement`` naming a role no agent has.

    A role neither built in nor known yet may be one an extension defines: the extensions are
    imported (as the agents will import them) before it is judged.

    Raises:
        SettingsError: The first unknown role, with the roles there are; or an extension that
            does not load.
    """
    if not settings.unknown_roles(roles()):
        return
    from stratagem.runtime.config._errors import InputError
    from stratagem.runtime.config._extensions import settings_roles

    try:
        known = settings_roles(settings)
    except InputError as exc:
        raise SettingsError(str(exc)) from exc
    unknown = settings.unknown_roles(known)
    if unknown:
        setting, role = unknown[0]
        raise SettingsError(f"{setting}: unknown role {role!r}; roles are: {', '.join(known)}")


def settings_digest(settings_json: str) -> str:
    """A short digest of the settings an agent was deployed with, to tell when they changed."""
    return hashlib.sha256(settings_json.encode()).hexdigest()[:16]
