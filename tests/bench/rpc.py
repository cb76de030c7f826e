"""Cross-agent request latency and throughput, actor to actor, beside a bare ``grpc.aio`` echo.

Two Ray actors on one embedded Ray. The target actor hosts, on its event loop:

* ``AgentServer`` s with the shipped policy (``Policy.default()``, which lets the orchestrator ask
  perception for ``FindSpatialContext``), each serving the ``perception`` role:

  - ``pipeline_agent``: the real perception agent (``build_agent("perception")``), whose handler
    plans and runs a two-step plan per request, with a ``SqliteAuditLog`` file;
  - ``pipeline_constant``: a trivial backend answering a constant response, so the pipeline's own
    cost shows apart from the agent's plan, with a ``SqliteAuditLog`` file;
  - ``pipeline_stream`` (for ``tests.bench.peers``): the ``pipeline_constant`` server itself,
    called with ``ClientConfig(call_stream=True)``: every call a frame of one long-lived
    ``CallStream`` (issue 37, candidate 5) through the same stages, handler, audit file and
    tracing as ``pipeline_constant``'s unary calls;
  - two diagnostics with the trivial backend: ``diag_memory_audit`` (an ``InMemoryAuditLog``
    instead of SQLite) and ``diag_memory_audit_noop_tracer`` (the same, with OpenTelemetry's no-op
    tracer at both ends);

* a bare ``grpc.aio`` server whose generic handler returns the request bytes (``echo``).

The pipeline variants trace like a deployed agent actor without ``OTEL_*`` settings: an SDK
``TracerProvider`` with no span processor at both ends (``setup_telemetry`` gives actors one), so
spans are made, propagated and dropped. Audit files live in a temporary directory, under
``.bench/`` when run by ``python -m tests.bench``: the file system of the default state directory.
Every pipeline variant authenticates like a deployment's default: token authentication
(``TokenAuthenticator``; the caller sends ``TokenCredentials``) with a cluster secret file in that
directory. What authentication costs is measured apart, in ``tests.bench.auth``. Once every server
(or client) is up, its process freezes its startup heap as an agent actor does before it serves
(``runtime.host._heap``).

The caller actor sends ``FindSpatialContext(entity_ids=["mira"])`` as the orchestrator through
``AgentClient.call``; the echo gets the bytes of the same encoded request envelope. Latency is
sequential calls timed one by one with ``time.perf_counter`` after a warm-up, in rounds that rotate
the order of the variants; throughput is a fixed number of calls by 32 concurrent workers (32 in
flight), requests per second of wall time.
"""

from __future__ import annotations

import asyncio
import cProfile
import logging
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import ray
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import NoOpTracerProvider, TracerProvider

from stratagem.agents import build_agent
from stratagem.protocol import (
    AgentBackend,
    AgentCard,
    AgentClient,
    AgentServer,
    AuditLog,
    CallContext,
    CapabilityCard,
    ClientConfig,
    ClusterSecret,
    ControlRequest,
    FailedPreconditionError,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
    InMemoryAuditLog,
    NotFoundError,
    PlanEvent,
    PlanSnapshot,
    Policy,
    ReplayResult,
    RequestEnvelope,
    ResponseEnvelope,
    RevisionsResponse,
    ServerConfig,
    SpatialContext,
    SqliteAuditLog,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
    WireModel,
    capability_for,
    encode_request,
    encode_response,
)
from stratagem.runtime.host._heap import freeze_startup_heap
from tests.bench.profiling import profile_summary
from tests.bench.stats import closed_loop, summarize

__all__ = [
    "DIAGNOSTICS",
    "ECHO",
    "PIPELINES",
    "VARIANTS",
    "BenchCaller",
    "BenchTarget",
    "ConstantBackend",
    "RpcBenchConfig",
    "run_rpc_benchmark",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ECHO: Final = "echo"
PIPELINE_AGENT: Final = "pipeline_agent"
PIPELINE_CONSTANT: Final = "pipeline_constant"
PIPELINE_STREAM: Final = "pipeline_stream"
"""``pipeline_constant``'s server over one ``CallStream`` (measured by ``tests.bench.peers``)."""
DIAG_MEMORY: Final = "diag_memory_audit"
DIAG_MEMORY_NOOP: Final = "diag_memory_audit_noop_tracer"
PIPELINES: Final = (PIPELINE_AGENT, PIPELINE_CONSTANT)
"""The full pipeline, with the real agent and with the trivial backend: the target applies."""
DIAGNOSTICS: Final = (DIAG_MEMORY, DIAG_MEMORY_NOOP)
"""Variants that take one cost out of the pipeline to attribute it."""
VARIANTS: Final = (ECHO, *PIPELINES, *DIAGNOSTICS)
PHASE_TIMEOUT_S: Final = 300.0
"""The longest any one actor call of the driver may take before the run is abandoned."""
LATENCY_TARGETS: Final = {PIPELINE_CONSTANT: 1.3, PIPELINE_AGENT: 1.6}
"""Issue 15's targets: each pipeline's median latency at most this many times the echo's."""
THROUGHPUT_TARGETS: Final = {PIPELINE_CONSTANT: 0.8, PIPELINE_AGENT: 0.6}
"""Issue 15's targets: each pipeline's throughput at 32 in flight, at least this share of the
echo's."""

CALLER: Final = "orchestrator"
TARGET: Final = "perception"
CAPABILITY: Final = "FindSpatialContext"
REQUEST: Final = FindSpatialContextRequest(entity_ids=["mira"])
RESPONSE: Final = FindSpatialContextResponse(contexts=[SpatialContext(entity_id="mira")])
"""What the perception agent answers ``REQUEST`` with while its world is empty."""
ECHO_SERVICE: Final = "stratagem.bench.Echo"
ECHO_METHOD: Final = f"/{ECHO_SERVICE}/Echo"
SECRET_FILE: Final = "cluster.secret"
"""The cluster secret's file name in the state directory; both actors read it."""


@dataclass(frozen=True, slots=True)
class RpcBenchConfig:
    """How many calls each variant gets.

    Attributes:
        warmup: Untimed sequential calls per variant first (and a burst of 4x ``concurrency``).
        latency_calls: Timed sequential calls per variant, spread over ``rounds``.
        rounds: Rounds of the latency and throughput phases; each rotates the variants' order.
        throughput_calls: Calls per variant at ``concurrency`` in flight, spread over ``rounds``.
        concurrency: Calls in flight during the throughput phase.
        profile_calls: Sequential calls profiled on both ends when a target is missed (0: never).
        audit_appends: ``SqliteAuditLog.append`` calls timed on their own in the target actor.
    """

    warmup: int = 200
    latency_calls: int = 2000
    rounds: int = 4
    throughput_calls: int = 3200
    concurrency: int = 32
    profile_calls: int = 500
    audit_appends: int = 300


class ConstantBackend:
    """A perception ``AgentBackend`` that answers every ``FindSpatialContext`` with ``RESPONSE``."""

    role: Final = TARGET

    def card(self) -> AgentCard:
        """A card naming the one capability served."""
        spec = capability_for(TARGET, CAPABILITY)
        assert spec is not None
        return AgentCard(
            role=TARGET, version="bench", capabilities=[CapabilityCard.from_spec(spec)]
        )

    async def handle(self, capability: str, request: WireModel, ctx: CallContext) -> WireModel:
        """The constant answer, whatever was asked."""
        return RESPONSE

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        """No plans to watch."""
        raise NotFoundError(f"no plan {plan_id!r}")
        yield  # an async generator, as the protocol asks

    async def run_plan(self, plan_json: str, ctx: CallContext) -> PlanSnapshot:
        """Runs no plans."""
        raise FailedPreconditionError("the constant backend runs no plans")

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """No plans."""
        return []

    async def control(self, request: ControlRequest, ctx: CallContext) -> PlanSnapshot:
        """No plans to control."""
        raise NotFoundError(f"no plan {request.plan_id!r}")

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """No plans, so no revisions."""
        raise NotFoundError(f"no plan {plan_id!r}")

    async def replay(self, plan_id: str, ctx: CallContext) -> ReplayResult:
        """No plans to replay."""
        raise NotFoundError(f"no plan {plan_id!r}")


async def _echo(request: bytes, context: Any) -> bytes:
    return request


def _count_records(log: AuditLog) -> int:
    return sum(1 for _ in log.records())


class BenchTarget:
    """The called side (a Ray actor): the agent servers and the bare echo on one event loop.

    Args:
        state_dir: Where the SQLite audit files go.
    """

    def __init__(self, state_dir: str) -> None:
        self._state_dir = Path(state_dir)
        self._servers: list[AgentServer] = []
        self._served: dict[str, tuple[AgentServer, AgentBackend]] = {}
        self._a2a: list[Any] = []
        self._audits: dict[str, AuditLog] = {}
        self._echo: Any = None
        self._profiler: cProfile.Profile | None = None

    async def start(self) -> dict[str, str]:
        """Start every server; the endpoint of each variant."""
        sdk = SdkTracerProvider(shutdown_on_exit=False)
        policy = Policy.default()
        constant = ConstantBackend()
        agent = build_agent(TARGET, tracer_provider=sdk)
        signer = TokenSigner(ClusterSecret.load_or_create(self._state_dir / SECRET_FILE))
        self._audits = {
            PIPELINE_AGENT: SqliteAuditLog(self._state_dir / "agent.sqlite3"),
            PIPELINE_CONSTANT: SqliteAuditLog(self._state_dir / "constant.sqlite3"),
            DIAG_MEMORY: InMemoryAuditLog(),
            DIAG_MEMORY_NOOP: InMemoryAuditLog(),
        }
        setups: dict[str, tuple[AgentBackend, TracerProvider]] = {
            PIPELINE_AGENT: (agent, sdk),
            PIPELINE_CONSTANT: (constant, sdk),
            DIAG_MEMORY: (constant, sdk),
            DIAG_MEMORY_NOOP: (constant, NoOpTracerProvider()),
        }
        endpoints: dict[str, str] = {}
        for name, (backend, provider) in setups.items():
            server = AgentServer(
                backend,
                policy=policy,
                authenticator=TokenAuthenticator(signer),
                audit=self._audits[name],
                config=ServerConfig(
                    host="127.0.0.1", port=0, call_streams=name == PIPELINE_CONSTANT
                ),
                tracer_provider=provider,
            )
            await server.start()
            self._servers.append(server)
            self._served[name] = (server, backend)
            endpoints[name] = server.endpoint
        echo = grpc.aio.server()
        echo.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
                ),
            )
        )
        port = echo.add_insecure_port("127.0.0.1:0")
        await echo.start()
        self._echo = echo
        endpoints[ECHO] = f"127.0.0.1:{port}"
        freeze_startup_heap()  # as an agent actor does before it serves
        return endpoints

    async def serve_a2a(self, variant: str) -> str:
        """Serve ``variant``'s agent over A2A too (through its server's pipeline); its URL."""
        from stratagem.protocol import A2AConfig, A2AServer

        server, backend = self._served[variant]
        a2a = A2AServer(server, backend, A2AConfig(host="127.0.0.1", port=0))
        await a2a.start()
        self._a2a.append(a2a)
        return a2a.url

    async def start_profile(self) -> None:
        """Profile this actor's event-loop thread (where gRPC serves) until ``stop_profile``."""
        self._profiler = cProfile.Profile()
        self._profiler.enable()

    async def stop_profile(self, requests: int) -> dict[str, Any]:
        """Stop profiling; the summary per request (see ``profile_summary``)."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            raise RuntimeError("not profiling")
        profiler.disable()
        return profile_summary(profiler, requests)

    async def audit_costs(self, appends: int) -> dict[str, Any]:
        """What one audit append costs here, timed apart from any request.

        Returns:
            ``sqlite_append_us`` (``SqliteAuditLog.append`` on a fresh file, called directly),
            ``thread_hop_us`` (``await asyncio.to_thread`` of a no-op, the pipeline's way to
            call the log) and ``memory_append_us`` (``InMemoryAuditLog.append``), each a summary.
        """

        def time_appends(log: AuditLog) -> list[float]:
            samples = []
            for index in range(appends):
                started = time.perf_counter()
                log.append(
                    actor=CALLER,
                    action="call.accepted",
                    target=TARGET,
                    capability=CAPABILITY,
                    request_id=f"{index:032x}",
                    digest="0" * 64,
                )
                samples.append(time.perf_counter() - started)
            return samples

        with SqliteAuditLog(self._state_dir / "scratch.sqlite3") as scratch:
            sqlite = time_appends(scratch)
        memory = time_appends(InMemoryAuditLog())
        hops = []
        for _ in range(appends):
            started = time.perf_counter()
            await asyncio.to_thread(int)
            hops.append(time.perf_counter() - started)
        return {
            "sqlite_append_us": summarize(sqlite, scale=1e6),
            "thread_hop_us": summarize(hops, scale=1e6),
            "memory_append_us": summarize(memory, scale=1e6),
        }

    async def audit_records(self) -> dict[str, int]:
        """How many records each variant's audit log holds (two per served call)."""
        return {
            name: await asyncio.to_thread(_count_records, log) for name, log in self._audits.items()
        }

    async def close(self) -> None:
        """Stop every server and close the SQLite files."""
        for a2a in self._a2a:
            await a2a.aclose()
        for server in self._servers:
            await server.aclose()
        if self._echo is not None:
            await self._echo.stop(0)
        for log in self._audits.values():
            if isinstance(log, SqliteAuditLog):
                log.close()


class BenchCaller:
    """The calling side (a Ray actor): one client per variant, and the load loops."""

    def __init__(self) -> None:
        self._calls: dict[str, Callable[[], Awaitable[object]]] = {}
        self._clients: list[AgentClient] = []
        self._channel: Any = None

    async def open(self, endpoints: dict[str, str], secret_file: str) -> dict[str, int]:
        """Connect to every variant (with a token made from ``secret_file``); check one answer
        of each.

        Returns:
            ``request_bytes`` (the encoded envelope, also the echo's payload) and
            ``response_bytes`` (the encoded response envelope the pipeline answers with).
        """
        sdk = SdkTracerProvider(shutdown_on_exit=False)
        credentials = TokenCredentials(
            TokenSigner(ClusterSecret.load_or_create(Path(secret_file))), CALLER
        )
        envelope = RequestEnvelope(
            request_id=uuid.uuid4().hex,
            caller=CALLER,
            target=TARGET,
            capability=CAPABILITY,
            body=REQUEST,
        )
        payload = encode_request(envelope)
        self._channel = grpc.aio.insecure_channel(endpoints[ECHO])
        echo = self._channel.unary_unary(ECHO_METHOD)
        self._calls[ECHO] = lambda: echo(payload)
        for name in (*PIPELINES, *DIAGNOSTICS):
            provider = NoOpTracerProvider() if name == DIAG_MEMORY_NOOP else sdk
            client = AgentClient(endpoints[name], credentials=credentials, tracer_provider=provider)
            self._clients.append(client)
            self._calls[name] = _pipeline_call(client)
        streamed = AgentClient(
            endpoints[PIPELINE_CONSTANT],
            credentials=credentials,
            config=ClientConfig(call_stream=True),
            tracer_provider=sdk,
        )
        self._clients.append(streamed)
        self._calls[PIPELINE_STREAM] = _pipeline_call(streamed)
        for name, call in self._calls.items():
            answer = await call()
            expected = payload if name == ECHO else RESPONSE
            if answer != expected:
                raise RuntimeError(f"{name} answered {answer!r}, not {expected!r}")
        freeze_startup_heap()  # the caller is an agent actor too
        response = ResponseEnvelope(
            request_id=envelope.request_id, responder=TARGET, capability=CAPABILITY, body=RESPONSE
        )
        return {"request_bytes": len(payload), "response_bytes": len(encode_response(response))}

    async def latency(self, variant: str, calls: int, profile: bool = False) -> dict[str, Any]:
        """``calls`` sequential calls, each timed; optionally profiled.

        Returns:
            ``samples`` (seconds per call) and, when profiled, ``profile``.
        """
        call = self._calls[variant]
        samples: list[float] = []
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        for _ in range(calls):
            started = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - started)
        result: dict[str, Any] = {"samples": samples}
        if profiler is not None:
            profiler.disable()
            result["profile"] = profile_summary(profiler, calls)
        return result

    async def throughput(self, variant: str, calls: int, concurrency: int) -> dict[str, Any]:
        """``calls`` calls by ``concurrency`` workers, each starting its next call at once.

        Returns:
            ``calls``, ``wall_s`` and ``samples`` (seconds per call, under load).
        """
        wall_s, samples = await closed_loop(self._calls[variant], calls, concurrency)
        return {"calls": calls, "wall_s": wall_s, "samples": samples}

    async def close(self) -> None:
        """Close every channel."""
        for client in self._clients:
            await client.aclose()
        if self._channel is not None:
            await self._channel.close()


def _pipeline_call(client: AgentClient) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await client.call(TARGET, CAPABILITY, REQUEST)

    return call


def _rotated(names: tuple[str, ...], shift: int) -> tuple[str, ...]:
    shift %= len(names)
    return names[shift:] + names[:shift]


PROFILED: Final = (ECHO, PIPELINE_CONSTANT, PIPELINE_AGENT)
"""The variants profiled when a target is missed: the echo is the baseline of the difference."""


@dataclass(slots=True)
class _Samples:
    """What the load phases collected, per variant."""

    latency: dict[str, list[float]] = field(default_factory=lambda: _per_variant(list))
    loaded: dict[str, list[float]] = field(default_factory=lambda: _per_variant(list))
    wall_s: dict[str, float] = field(default_factory=lambda: _per_variant(float))
    calls: dict[str, int] = field(default_factory=lambda: _per_variant(int))


def _per_variant(make: Callable[[], T]) -> dict[str, T]:
    return {name: make() for name in VARIANTS}


def run_rpc_benchmark(
    config: RpcBenchConfig | None = None,
    *,
    profile: bool | None = None,
    state_parent: Path | None = None,
) -> dict[str, Any]:
    """Start an embedded Ray, run the two actors' load and shut Ray down.

    Args:
        config: Call counts; ``RpcBenchConfig()`` by default.
        profile: Profile a window of calls of the echo and of both pipelines, on both ends:
            always (``True``), never (``False``) or only when a pipeline misses the target
            (``None``).
        state_parent: Where the temporary directory of the audit files is made (created when
            missing); the system's temporary directory when ``None``.

    Returns:
        A JSON-ready dict: ``config``, ``payload`` sizes, ``variants`` (per variant:
        ``latency_us`` and ``under_load_us`` summaries, ``throughput_rps``), ``ratios`` (median
        and p99 latency and throughput of each variant against the echo), ``targets`` (one per
        pipeline variant), ``attribution`` (differences of median latency between variants, µs),
        ``audit`` (append costs and record counts) and, when profiled, ``profile`` (per profiled
        variant: ``server`` and ``client`` summaries, ``latency_us`` while profiled).
    """
    config = config or RpcBenchConfig()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    samples = _Samples()
    profiles: dict[str, Any] = {}
    if state_parent is not None:
        state_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="audit-", dir=state_parent) as state_dir:
        logger.info("rpc: starting an embedded Ray")
        ray.init(
            address="local",
            include_dashboard=False,
            namespace="stratagem-bench",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        try:
            # Typed as Any: Ray's handle types do not model an actor's methods as remote methods.
            target: Any = ray.remote(BenchTarget).options(num_cpus=0).remote(state_dir)
            caller: Any = ray.remote(BenchCaller).options(num_cpus=0).remote()
            endpoints = _get(target.start.remote())
            secret_file = str(Path(state_dir) / SECRET_FILE)
            payload = _get(caller.open.remote(endpoints, secret_file))
            _load(caller, config, samples)
            medians = {name: statistics.median(values) for name, values in samples.latency.items()}
            missed = any(
                medians[name] / medians[ECHO] > LATENCY_TARGETS[name] for name in PIPELINES
            )
            if config.profile_calls and (profile or (profile is None and missed)):
                profiles = _profile(target, caller, config.profile_calls)
            logger.info("rpc: timing audit appends on their own")
            audit = _get(target.audit_costs.remote(config.audit_appends))
            audit["records"] = _get(target.audit_records.remote())
            _get(caller.close.remote())
            _get(target.close.remote())
        finally:
            ray.shutdown()
    return _summarize(config, payload, samples, audit, profiles)


def _load(caller: Any, config: RpcBenchConfig, samples: _Samples) -> None:
    """Warm up, then the latency rounds, then the throughput rounds."""
    logger.info("rpc: warming up %d variants", len(VARIANTS))
    for name in VARIANTS:
        _get(caller.latency.remote(name, config.warmup))
        _get(caller.throughput.remote(name, 4 * config.concurrency, config.concurrency))
    calls = max(1, config.latency_calls // config.rounds)
    for index in range(config.rounds):
        logger.info("rpc: latency round %d/%d (%d calls each)", index + 1, config.rounds, calls)
        for name in _rotated(VARIANTS, index):
            samples.latency[name] += _get(caller.latency.remote(name, calls))["samples"]
    calls = max(config.concurrency, config.throughput_calls // config.rounds)
    for index in range(config.rounds):
        logger.info(
            "rpc: throughput round %d/%d (%d calls each, %d in flight)",
            index + 1,
            config.rounds,
            calls,
            config.concurrency,
        )
        for name in _rotated(VARIANTS, index):
            run = _get(caller.throughput.remote(name, calls, config.concurrency))
            samples.loaded[name] += run["samples"]
            samples.wall_s[name] += run["wall_s"]
            samples.calls[name] += run["calls"]


def _profile(target: Any, caller: Any, calls: int) -> dict[str, Any]:
    """Profile ``calls`` sequential calls of each ``PROFILED`` variant on both ends."""
    profiles: dict[str, Any] = {}
    for name in PROFILED:
        logger.info("rpc: profiling %d %s calls on both ends", calls, name)
        _get(target.start_profile.remote())
        window = _get(caller.latency.remote(name, calls, True))
        profiles[name] = {
            "server": _get(target.stop_profile.remote(calls)),
            "client": window["profile"],
            "latency_us": summarize(window["samples"], scale=1e6),
        }
    return profiles


def _get(ref: Any) -> Any:
    """The result of one actor call, waiting at most ``PHASE_TIMEOUT_S``."""
    return ray.get(ref, timeout=PHASE_TIMEOUT_S)


def _summarize(
    config: RpcBenchConfig,
    payload: dict[str, int],
    samples: _Samples,
    audit: dict[str, Any],
    profiles: dict[str, Any],
) -> dict[str, Any]:
    variants: dict[str, dict[str, Any]] = {
        name: {
            "latency_us": summarize(samples.latency[name], scale=1e6),
            "under_load_us": summarize(samples.loaded[name], scale=1e6),
            "throughput_rps": round(samples.calls[name] / samples.wall_s[name], 1),
        }
        for name in VARIANTS
    }
    echo_median = variants[ECHO]["latency_us"]["median"]
    echo_rps = variants[ECHO]["throughput_rps"]
    ratios = {
        name: {
            "median_latency": round(variants[name]["latency_us"]["median"] / echo_median, 3),
            "p99_latency": round(
                variants[name]["latency_us"]["p99"] / variants[ECHO]["latency_us"]["p99"], 3
            ),
            "throughput": round(variants[name]["throughput_rps"] / echo_rps, 3),
        }
        for name in VARIANTS
        if name != ECHO
    }
    median = {name: variants[name]["latency_us"]["median"] for name in VARIANTS}
    attribution = {
        "agent_plan_us": round(median[PIPELINE_AGENT] - median[PIPELINE_CONSTANT], 1),
        "sqlite_audit_us": round(median[PIPELINE_CONSTANT] - median[DIAG_MEMORY], 1),
        "tracing_us": round(median[DIAG_MEMORY] - median[DIAG_MEMORY_NOOP], 1),
        "rest_of_pipeline_us": round(median[DIAG_MEMORY_NOOP] - median[ECHO], 1),
        "echo_us": median[ECHO],
    }
    targets: list[dict[str, Any]] = []
    for name in PIPELINES:
        latency, throughput = ratios[name]["median_latency"], ratios[name]["throughput"]
        targets += [
            {
                "variant": name,
                "measure": "latency",
                "max_ratio": LATENCY_TARGETS[name],
                "ratio": latency,
                "met": latency <= LATENCY_TARGETS[name],
            },
            {
                "variant": name,
                "measure": "throughput",
                "min_ratio": THROUGHPUT_TARGETS[name],
                "ratio": throughput,
                "met": throughput >= THROUGHPUT_TARGETS[name],
            },
        ]
    result: dict[str, Any] = {
        "config": asdict(config),
        "payload": payload,
        "variants": variants,
        "ratios": ratios,
        "targets": targets,
        "attribution": attribution,
        "audit": audit,
    }
    if profiles:
        result["profile"] = profiles
    return result
