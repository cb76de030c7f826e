"""The cost of security: request latency and throughput with auth off, token auth and mTLS.

Two OS processes on one machine, as in ``tests.bench.rpc``'s two actors (without Ray):

* the server process (``python -m tests.bench.auth serve STATE_DIR``) hosts, on one event loop,
  three ``AgentServer`` s of the ``perception`` role, identical but for their authenticator:

  - ``auth_off``: ``CallerMetadataAuthenticator`` (the caller's name, trusted as sent);
  - ``token``: ``TokenAuthenticator`` with a cluster secret file (the default of a deployment);
  - ``mtls``: ``TlsAuthenticator`` with certificates from ``init_certificates``;

  each with the shipped policy, a ``SqliteAuditLog`` file of its own and a constant handler (the
  fake backend answers ``FindSpatialContext`` with a fixed response at once), traced like a
  deployed agent without ``OTEL_*`` settings (an SDK ``TracerProvider`` with no span processor);
  this is ``tests.bench.rpc``'s ``pipeline_constant`` case;

* this process calls them as ``orchestrator`` through ``AgentClient.call``: with its name only
  (auth off), with ``TokenCredentials`` (token) and with ``TlsCredentials`` (mTLS).

The three modes are measured in the same run, in rounds that rotate their order, so a noisy
machine slows them alike. Latency: sequential calls, each timed with ``time.perf_counter``;
throughput: a fixed number of calls by ``concurrency`` workers, requests per second of wall time.
Both on long-lived channels: the TLS handshake is paid once per channel, and timed on its own
(``first_call_ms``: a fresh client's first call, connection and handshake included). CPU time is
charged to the mode whose calls ran meanwhile, for both processes (``cpu_us_per_call``: this
process's ``time.process_time``, the server's user + system time from ``/proc``, all threads,
gRPC's included): on a machine shared with other work it varies less than wall time does.

The target (issue 4): token auth costs at most 10% over auth off, in median latency and in
throughput.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from opentelemetry.sdk.trace import TracerProvider

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ClusterSecret,
    Credentials,
    FindSpatialContextRequest,
    Policy,
    ServerConfig,
    SqliteAuditLog,
    TlsAuthenticator,
    TlsCredentials,
    TlsFiles,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
    init_certificates,
)
from stratagem.protocol._identity import Authenticator
from tests.bench.stats import closed_loop, summarize
from tests.unit.protocol._support import SAMPLES, FakeBackend

__all__ = ["MODES", "AuthBenchConfig", "run_auth_benchmark"]

logger = logging.getLogger(__name__)

OFF: Final = "auth_off"
TOKEN: Final = "token"
MTLS: Final = "mtls"
MODES: Final = (OFF, TOKEN, MTLS)
TARGET_RATIO: Final = 1.10
"""The issue's target: token auth costs at most 10% over auth off."""

CALLER: Final = "orchestrator"
TARGET: Final = "perception"
CAPABILITY: Final = "FindSpatialContext"
REQUEST: Final = FindSpatialContextRequest(entity_ids=["mira"])
RESPONSE: Final = SAMPLES[CAPABILITY][1]
SECRET_FILE: Final = "cluster.secret"
CERTS_DIR: Final = "certs"
STARTUP_TIMEOUT_S: Final = 60.0
REPO: Final = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class AuthBenchConfig:
    """How many calls each mode gets.

    Attributes:
        warmup: Untimed sequential calls per mode first (and a burst of 4x ``concurrency``).
        latency_calls: Timed sequential calls per mode, spread over ``rounds``.
        rounds: Rounds of each phase; each rotates the modes' order.
        throughput_calls: Calls per mode at ``concurrency`` in flight, spread over ``rounds``.
        concurrency: Calls in flight during the throughput phase.
        connects: Fresh clients per mode whose first call (connection and handshake) is timed.
    """

    warmup: int = 300
    latency_calls: int = 3000
    rounds: int = 20
    throughput_calls: int = 6000
    concurrency: int = 32
    connects: int = 30


# --- the server process ---------------------------------------------------------------------


def _authenticators(state_dir: Path) -> dict[str, Authenticator]:
    signer = TokenSigner(ClusterSecret.load_or_create(state_dir / SECRET_FILE))
    return {
        OFF: CallerMetadataAuthenticator(),
        TOKEN: TokenAuthenticator(signer),
        MTLS: TlsAuthenticator(TlsFiles.for_identity(state_dir / CERTS_DIR, TARGET)),
    }


async def _serve(state_dir: Path) -> None:
    """Serve the three modes; print their endpoints as one JSON line; stop when stdin closes."""
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    backend = FakeBackend(TARGET)
    policy = Policy.default()
    servers: list[AgentServer] = []
    audits: list[SqliteAuditLog] = []
    endpoints: dict[str, str] = {}
    try:
        for mode, authenticator in _authenticators(state_dir).items():
            audit = SqliteAuditLog(state_dir / f"{mode}.sqlite3")
            audits.append(audit)
            server = AgentServer(
                backend,
                policy=policy,
                authenticator=authenticator,
                audit=audit,
                config=ServerConfig(host="127.0.0.1", port=0),
                tracer_provider=tracer_provider,
            )
            await server.start()
            servers.append(server)
            endpoints[mode] = server.endpoint
        sys.stdout.write(json.dumps(endpoints) + "\n")
        sys.stdout.flush()
        await asyncio.to_thread(sys.stdin.read)
    finally:
        for server in servers:
            await server.aclose()
        for audit in audits:
            audit.close()


# --- the calling side -----------------------------------------------------------------------


def _credentials(state_dir: Path) -> dict[str, Credentials | None]:
    signer = TokenSigner(ClusterSecret.load_or_create(state_dir / SECRET_FILE))
    return {
        OFF: None,
        TOKEN: TokenCredentials(signer, CALLER),
        MTLS: TlsCredentials(TlsFiles.for_identity(state_dir / CERTS_DIR, CALLER)),
    }


@dataclass(slots=True)
class _Modes:
    """One long-lived client per mode, and how to make a fresh one."""

    endpoints: dict[str, str]
    credentials: dict[str, Credentials | None]
    tracer_provider: TracerProvider

    def client(self, mode: str) -> AgentClient:
        return AgentClient(
            self.endpoints[mode],
            caller=CALLER,
            credentials=self.credentials[mode],
            tracer_provider=self.tracer_provider,
        )


def _caller(client: AgentClient) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await client.call(TARGET, CAPABILITY, REQUEST)

    return call


async def _latency(call: Callable[[], Awaitable[object]], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def _rotated(names: tuple[str, ...], shift: int) -> tuple[str, ...]:
    shift %= len(names)
    return names[shift:] + names[:shift]


def _process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) process ``pid`` has used; ``None`` without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name: state, ppid, ...
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class _Cpu:
    """CPU time of both processes, charged to the mode whose calls ran meanwhile."""

    server_pid: int
    client_s: dict[str, float]
    server_s: dict[str, float | None]
    calls: dict[str, int]

    def start(self) -> tuple[float, float | None]:
        return time.process_time(), _process_cpu_s(self.server_pid)

    def charge(self, mode: str, since: tuple[float, float | None], calls: int) -> None:
        client, server = self.start()
        self.client_s[mode] += client - since[0]
        before, used = since[1], self.server_s[mode]
        self.server_s[mode] = (
            None if server is None or before is None or used is None else used + server - before
        )
        self.calls[mode] += calls

    def per_call_us(self) -> dict[str, dict[str, float | None]]:
        return {
            mode: {
                "client": round(self.client_s[mode] / self.calls[mode] * 1e6, 1),
                "server": None
                if (server := self.server_s[mode]) is None
                else round(server / self.calls[mode] * 1e6, 1),
            }
            for mode in MODES
        }


@dataclass(slots=True)
class _Samples:
    latency: dict[str, list[float]]
    loaded: dict[str, list[float]]
    wall_s: dict[str, float]
    calls: dict[str, int]
    first_call: dict[str, list[float]]
    cpu: _Cpu


async def _measure(modes: _Modes, config: AuthBenchConfig, server_pid: int) -> _Samples:
    clients = {mode: modes.client(mode) for mode in MODES}
    calls = {mode: _caller(client) for mode, client in clients.items()}
    samples = _Samples(
        latency={mode: [] for mode in MODES},
        loaded={mode: [] for mode in MODES},
        wall_s=dict.fromkeys(MODES, 0.0),
        calls=dict.fromkeys(MODES, 0),
        first_call={mode: [] for mode in MODES},
        cpu=_Cpu(
            server_pid=server_pid,
            client_s=dict.fromkeys(MODES, 0.0),
            server_s=dict.fromkeys(MODES, 0.0),
            calls=dict.fromkeys(MODES, 0),
        ),
    )
    try:
        for mode, call in calls.items():
            answer = await call()
            if answer != RESPONSE:
                raise RuntimeError(f"{mode} answered {answer!r}, not {RESPONSE!r}")
        logger.info("auth: warming up %s", ", ".join(MODES))
        for mode in MODES:
            await _latency(calls[mode], config.warmup)
            await closed_loop(calls[mode], 4 * config.concurrency, config.concurrency)
        per_round = max(1, config.latency_calls // config.rounds)
        for index in range(config.rounds):
            logger.info(
                "auth: latency round %d/%d (%d calls each)", index + 1, config.rounds, per_round
            )
            for mode in _rotated(MODES, index):
                gc.collect()
                since = samples.cpu.start()
                samples.latency[mode] += await _latency(calls[mode], per_round)
                samples.cpu.charge(mode, since, per_round)
        per_round = max(config.concurrency, config.throughput_calls // config.rounds)
        for index in range(config.rounds):
            logger.info(
                "auth: throughput round %d/%d (%d calls each, %d in flight)",
                index + 1,
                config.rounds,
                per_round,
                config.concurrency,
            )
            for mode in _rotated(MODES, index):
                gc.collect()
                since = samples.cpu.start()
                wall_s, loaded = await closed_loop(calls[mode], per_round, config.concurrency)
                samples.cpu.charge(mode, since, per_round)
                samples.wall_s[mode] += wall_s
                samples.calls[mode] += per_round
                samples.loaded[mode] += loaded
        logger.info("auth: %d fresh clients per mode, first call timed", config.connects)
        for index in range(config.connects):
            for mode in _rotated(MODES, index):
                async with modes.client(mode) as fresh:
                    samples.first_call[mode] += await _latency(_caller(fresh), 1)
    finally:
        for client in clients.values():
            await client.aclose()
    return samples


async def _run(config: AuthBenchConfig, state_dir: Path) -> _Samples:
    """Start the server process, measure from here, stop it."""
    ClusterSecret.load_or_create(state_dir / SECRET_FILE)
    init_certificates(state_dir / CERTS_DIR, (TARGET, CALLER))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.bench.auth",
        "serve",
        str(state_dir),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_TIMEOUT_S)
        if not line:
            raise RuntimeError("the auth benchmark's server process exited before serving")
        modes = _Modes(
            endpoints=json.loads(line),
            credentials=_credentials(state_dir),
            tracer_provider=TracerProvider(shutdown_on_exit=False),
        )
        return await _measure(modes, config, process.pid)
    finally:
        if process.returncode is None:
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 30.0)
            except TimeoutError:
                process.kill()
                await process.wait()


def run_auth_benchmark(
    config: AuthBenchConfig | None = None, *, state_parent: Path | None = None
) -> dict[str, Any]:
    """Measure the three modes in one run.

    Args:
        config: Call counts; ``AuthBenchConfig()`` by default.
        state_parent: Where the temporary directory of the secret, certificates and audit files
            is made (created when missing); the system's temporary directory when ``None``.

    Returns:
        A JSON-ready dict: ``config``; ``modes`` (per mode: ``latency_us`` and ``under_load_us``
        summaries, ``throughput_rps``, ``first_call_ms`` summary, ``cpu_us_per_call`` of the
        client and the server); ``ratios`` (token and mtls against auth off: median and p99
        latency, throughput, first call, CPU of both processes per call); ``throughput_cost``
        (auth off's requests per second over each mode's); ``targets`` (token's median latency
        and throughput cost against ``TARGET_RATIO``); ``met``.
    """
    config = config or AuthBenchConfig()
    if state_parent is not None:
        state_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="auth-", dir=state_parent) as state_dir:
        samples = asyncio.run(_run(config, Path(state_dir)))
    return _summarize(config, samples)


def _summarize(config: AuthBenchConfig, samples: _Samples) -> dict[str, Any]:
    cpu = samples.cpu.per_call_us()
    modes: dict[str, dict[str, Any]] = {
        mode: {
            "latency_us": summarize(samples.latency[mode], scale=1e6),
            "under_load_us": summarize(samples.loaded[mode], scale=1e6),
            "throughput_rps": round(samples.calls[mode] / samples.wall_s[mode], 1),
            "first_call_ms": summarize(samples.first_call[mode], scale=1e3, digits=3)
            if samples.first_call[mode]
            else None,
            "cpu_us_per_call": cpu[mode],
        }
        for mode in MODES
    }
    off = modes[OFF]
    ratios = {
        mode: {
            "median_latency": round(
                modes[mode]["latency_us"]["median"] / off["latency_us"]["median"], 3
            ),
            "p99_latency": round(modes[mode]["latency_us"]["p99"] / off["latency_us"]["p99"], 3),
            "throughput": round(modes[mode]["throughput_rps"] / off["throughput_rps"], 3),
            "first_call": round(
                modes[mode]["first_call_ms"]["median"] / off["first_call_ms"]["median"], 3
            )
            if modes[mode]["first_call_ms"] and off["first_call_ms"]
            else None,
            "cpu": _cpu_ratio(cpu[mode], cpu[OFF]),
        }
        for mode in (TOKEN, MTLS)
    }
    # The cost of a mode in throughput: how much longer the same calls take, off's rps over its.
    cost = {
        mode: round(off["throughput_rps"] / modes[mode]["throughput_rps"], 3) for mode in ratios
    }
    targets = [
        {
            "variant": TOKEN,
            "measure": "median_latency",
            "ratio": ratios[TOKEN]["median_latency"],
            "max_ratio": TARGET_RATIO,
            "met": ratios[TOKEN]["median_latency"] <= TARGET_RATIO,
        },
        {
            "variant": TOKEN,
            "measure": "throughput_cost",
            "ratio": cost[TOKEN],
            "max_ratio": TARGET_RATIO,
            "met": cost[TOKEN] <= TARGET_RATIO,
        },
    ]
    return {
        "config": asdict(config),
        "modes": modes,
        "ratios": ratios,
        "throughput_cost": cost,
        "targets": targets,
        "met": all(target["met"] for target in targets),
    }


def _cpu_ratio(mode: dict[str, float | None], off: dict[str, float | None]) -> float | None:
    """Both processes' CPU per call in ``mode`` over auth off's; ``None`` without server CPU."""
    if mode["server"] is None or off["server"] is None or mode["client"] is None:
        return None
    return round((mode["client"] + mode["server"]) / ((off["client"] or 0.0) + off["server"]), 3)


def main() -> int:
    """``python -m tests.bench.auth serve STATE_DIR``: the server process of the benchmark."""
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.stderr.write("usage: python -m tests.bench.auth serve STATE_DIR\n")
        return 2
    asyncio.run(_serve(Path(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
