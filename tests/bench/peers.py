"""Stratagem's request path beside its peers: AutoGen's gRPC worker runtime and the A2A SDK.

Every variant runs in one harness, in this run: a server process (or two) and a driver process per
measurement, on 127.0.0.1, no Ray. The driver warms up, times sequential calls one by one
(latency), then runs a closed loop of ``concurrency`` callers (throughput), and prints its samples
as one JSON line. Variants, in rounds that rotate their order:

* ``echo``: a bare ``grpc.aio`` server whose generic handler returns the request bytes, called
  with the bytes of Stratagem's encoded request envelope (the floor of any gRPC request);
* ``pipeline_constant`` / ``pipeline_agent``: Stratagem's full server pipeline (token
  authentication, authorization, validation, audit to SQLite, tracing with an SDK tracer provider)
  answering ``FindSpatialContext`` with a constant, and with the real perception agent's two-step
  plan — the servers and clients of ``tests.bench.rpc`` (``BenchTarget``, ``BenchCaller``), here in
  plain processes instead of Ray actors;
* ``pipeline_stream``: ``pipeline_constant``'s server (same handler, token authentication, policy,
  validation, SQLite audit, tracing), every call a frame of one long-lived ``CallStream`` instead
  of a unary ``Call`` (``ClientConfig(call_stream=True)``; issue 37, candidate 5);
* ``autogen``: autogen-core / autogen-ext[grpc] 0.7.5: a host service process, a worker runtime
  process with an echoing ``RoutedAgent``, and a driver worker runtime calling it with
  ``send_message`` (worker -> host -> worker and back; JSON payloads; no authentication,
  validation or audit);
* ``a2a``: a2a-sdk 1.3.0: one agent served by the SDK's JSON-RPC routes under uvicorn, called with
  the SDK's client (``SendMessage``, non-streaming, over HTTP/1.1 with keep-alive);
* ``a2a_stratagem``: the same A2A round trip (the same SDK client and driver) to Stratagem's A2A
  face of ``pipeline_constant`` (``protocol.A2AServer``: every request through that server's full
  pipeline, token authentication included), answering ``FindSpatialContext`` with a constant task.

The peers pin other grpcio/protobuf versions than Stratagem, so each is installed into a venv of
its own under ``.bench/peers/`` (once; a stamp names the pinned requirements) and runs from the
scripts ``peer_autogen.py`` / ``peer_a2a.py``, which import nothing of Stratagem.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from tests.bench.stats import summarize

__all__ = ["PEER_REQUIREMENTS", "VARIANTS", "PeersBenchConfig", "run_peers_benchmark"]

logger = logging.getLogger(__name__)

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parents[1]
ECHO: Final = "echo"
PIPELINE_CONSTANT: Final = "pipeline_constant"
PIPELINE_AGENT: Final = "pipeline_agent"
PIPELINE_STREAM: Final = "pipeline_stream"
AUTOGEN: Final = "autogen"
A2A: Final = "a2a"
A2A_STRATAGEM: Final = "a2a_stratagem"
STRATAGEM_VARIANTS: Final = (ECHO, PIPELINE_CONSTANT, PIPELINE_STREAM, PIPELINE_AGENT)
PEERS: Final = (AUTOGEN, A2A)
VARIANTS: Final = (*STRATAGEM_VARIANTS, *PEERS, A2A_STRATAGEM)
PEER_REQUIREMENTS: Final[dict[str, tuple[str, ...]]] = {
    AUTOGEN: ("autogen-core==0.7.5", "autogen-ext[grpc]==0.7.5"),
    A2A: ("a2a-sdk[http-server]==1.3.0", "uvicorn==0.54.0"),
}
TEXT: Final = "Mira waits in the courtyard, where the old key lay in a chest."
"""What the peers' messages carry (their payload is JSON around it)."""
START_TIMEOUT_S: Final = 60.0
DRIVE_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class PeersBenchConfig:
    """How many calls each variant gets per round.

    Attributes:
        warmup: Untimed sequential calls at the start of every driver process.
        latency_calls: Timed sequential calls per variant per round.
        throughput_calls: Calls per variant per round at ``concurrency`` in flight.
        concurrency: Calls in flight during the throughput phase.
        rounds: Rounds; each rotates the variants' order.
    """

    warmup: int = 200
    latency_calls: int = 500
    throughput_calls: int = 1600
    concurrency: int = 32
    rounds: int = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _peer_python(folder: Path, name: str) -> Path:
    """The python of the peer's own venv, created and filled on first use."""
    venv = folder / name
    python = venv / "bin" / "python"
    stamp = venv / ".requirements"
    wanted = "\n".join(PEER_REQUIREMENTS[name])
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    logger.info("peers: installing %s into %s", " ".join(PEER_REQUIREMENTS[name]), venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *PEER_REQUIREMENTS[name]],
        check=True,
        capture_output=True,
    )
    stamp.write_text(wanted)
    return python


class _Server:
    """A server process that prints one line once it serves; stopped by its PID."""

    def __init__(self, args: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            list(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )

    def ready_line(self) -> str:
        assert self.process.stdout is not None
        line = _readline(self.process, START_TIMEOUT_S)
        if not line:
            raise RuntimeError(f"{self.process.args} exited {self.process.poll()} before serving")
        return line.strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _readline(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise RuntimeError(f"{process.args} did not start within {timeout_s:.0f}s")
    return process.stdout.readline()


def _drive(args: Sequence[str]) -> dict[str, Any]:
    result = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=DRIVE_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{args[:3]} exited {result.returncode}: {result.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def run_peers_benchmark(
    config: PeersBenchConfig | None = None, *, folder: Path | None = None
) -> dict[str, Any]:
    """Install the peers (once), start every server, run the rounds, stop the servers.

    Args:
        config: Call counts; ``PeersBenchConfig()`` by default.
        folder: Where the peers' venvs and the audit files go (``.bench/peers`` by default).

    Returns:
        A JSON-ready dict: ``config``, ``peers`` (their pinned requirements), ``variants`` (per
        variant ``latency_us`` and ``under_load_us`` summaries and ``throughput_rps``),
        ``ratios`` (each variant's median latency and throughput against the echo's),
        ``a2a_face`` (Stratagem's A2A face against the plain A2A SDK server, same round trip),
        ``targets`` (Stratagem's pipelines against AutoGen's runtime), ``against_autogen`` (their
        median latency and throughput as ratios of AutoGen's) and ``stream_vs_unary``
        (``pipeline_stream`` against ``pipeline_constant``), or ``skipped`` with the reason when
        a peer could not be installed.
    """
    config = config or PeersBenchConfig()
    folder = folder or REPO / ".bench" / "peers"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        pythons = {name: _peer_python(folder, name) for name in PEERS}
    except (subprocess.CalledProcessError, OSError) as exc:
        return {"skipped": f"a peer could not be installed: {exc}"}
    counts = [
        str(config.warmup),
        str(config.latency_calls),
        str(config.throughput_calls),
        str(config.concurrency),
    ]
    servers: list[_Server] = []
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    loaded_calls: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    loaded_wall: dict[str, float] = dict.fromkeys(VARIANTS, 0.0)
    with tempfile.TemporaryDirectory(prefix="peers-", dir=folder) as state_dir:
        try:
            ours = _Server([sys.executable, "-m", "tests.bench.peers", "serve", state_dir])
            servers.append(ours)
            endpoints = ours.ready_line()
            autogen_port = _free_port()
            for role in ("host", "target"):
                server = _Server(
                    [str(pythons[AUTOGEN]), str(HERE / "peer_autogen.py"), role, str(autogen_port)]
                )
                servers.append(server)
                server.ready_line()
            a2a_port = _free_port()
            a2a = _Server([str(pythons[A2A]), str(HERE / "peer_a2a.py"), "serve", str(a2a_port)])
            servers.append(a2a)
            a2a.ready_line()
            drivers: dict[str, list[str]] = {
                name: [
                    sys.executable,
                    "-m",
                    "tests.bench.peers",
                    "drive",
                    endpoints,
                    str(Path(state_dir) / "cluster.secret"),
                    name,
                    *counts,
                ]
                for name in STRATAGEM_VARIANTS
            }
            stratagem_a2a = json.loads(endpoints)[A2A_STRATAGEM]
            drivers[AUTOGEN] = [
                str(pythons[AUTOGEN]),
                str(HERE / "peer_autogen.py"),
                "drive",
                str(autogen_port),
                TEXT,
                *counts,
            ]
            drivers[A2A] = [
                str(pythons[A2A]),
                str(HERE / "peer_a2a.py"),
                "drive",
                str(a2a_port),
                TEXT,
                *counts,
            ]
            # The same driver against Stratagem's A2A face: a token, a skill and its request.
            drivers[A2A_STRATAGEM] = [
                str(pythons[A2A]),
                str(HERE / "peer_a2a.py"),
                "drive",
                stratagem_a2a,
                TEXT,
                *counts,
                _operator_token(Path(state_dir)),
                "FindSpatialContext",
                json.dumps({"entity_ids": ["mira"]}),
            ]
            for index in range(config.rounds):
                shift = index % len(VARIANTS)
                for name in (*VARIANTS[shift:], *VARIANTS[:shift]):
                    logger.info("peers: round %d/%d, %s", index + 1, config.rounds, name)
                    answer = _drive(drivers[name])
                    samples[name] += answer["latency"]
                    loaded_calls[name] += answer["calls"]
                    loaded_wall[name] += answer["wall_s"]
        finally:
            for server in reversed(servers):
                server.stop()
    return summarize_peers(config, samples, loaded_calls, loaded_wall)


def _operator_token(state_dir: Path) -> str:
    """A token for the operator, signed with the bench target's cluster secret."""
    from stratagem.protocol import ClusterSecret, TokenSigner

    secret = ClusterSecret.load(state_dir / "cluster.secret")
    return TokenSigner(secret).issue("operator", 3 * 3600)


def summarize_peers(
    config: PeersBenchConfig,
    samples: dict[str, list[float]],
    loaded_calls: dict[str, int],
    loaded_wall: dict[str, float],
) -> dict[str, Any]:
    """The section's results from the drivers' samples (seconds) and loaded phases."""
    variants = {
        name: {
            "latency_us": summarize(samples[name], scale=1e6),
            "throughput_rps": round(loaded_calls[name] / loaded_wall[name], 1),
        }
        for name in VARIANTS
    }
    medians = {name: statistics.median(samples[name]) for name in VARIANTS}
    ratios = {
        name: {
            "median_latency": round(medians[name] / medians[ECHO], 2),
            "throughput": round(
                variants[name]["throughput_rps"] / variants[ECHO]["throughput_rps"], 2
            ),
        }
        for name in VARIANTS
        if name != ECHO
    }
    a2a_face = {
        "median_latency": round(medians[A2A_STRATAGEM] / medians[A2A], 2),
        "throughput": round(
            variants[A2A_STRATAGEM]["throughput_rps"] / variants[A2A]["throughput_rps"], 2
        ),
    }
    targets = {
        f"{name}_beats_autogen": {
            "latency": medians[name] < medians[AUTOGEN],
            "throughput": variants[name]["throughput_rps"] > variants[AUTOGEN]["throughput_rps"],
        }
        for name in (PIPELINE_CONSTANT, PIPELINE_STREAM, PIPELINE_AGENT)
    }
    against_autogen = {
        name: {
            "median_latency": round(medians[name] / medians[AUTOGEN], 2),
            "throughput": round(
                variants[name]["throughput_rps"] / variants[AUTOGEN]["throughput_rps"], 2
            ),
        }
        for name in (PIPELINE_CONSTANT, PIPELINE_STREAM, PIPELINE_AGENT)
    }
    stream_vs_unary = {
        "median_latency": round(medians[PIPELINE_STREAM] / medians[PIPELINE_CONSTANT], 2),
        "throughput": round(
            variants[PIPELINE_STREAM]["throughput_rps"]
            / variants[PIPELINE_CONSTANT]["throughput_rps"],
            2,
        ),
    }
    return {
        "config": asdict(config),
        "peers": {name: list(reqs) for name, reqs in PEER_REQUIREMENTS.items()},
        "variants": variants,
        "ratios": ratios,
        "a2a_face": a2a_face,
        "targets": targets,
        "against_autogen": against_autogen,
        "stream_vs_unary": stream_vs_unary,
    }


async def _serve(state_dir: str) -> None:
    from tests.bench.rpc import BenchTarget

    target = BenchTarget(state_dir)
    endpoints = await target.start()
    endpoints[A2A_STRATAGEM] = await target.serve_a2a(PIPELINE_CONSTANT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps(endpoints), flush=True)
    try:
        await stop.wait()
    finally:
        await target.close()


async def _drive_ours(
    endpoints: str,
    secret_file: str,
    variant: str,
    warmup: int,
    latency: int,
    throughput: int,
    concurrency: int,
) -> None:
    from tests.bench.rpc import BenchCaller

    caller = BenchCaller()
    await caller.open(json.loads(endpoints), secret_file)
    try:
        await caller.latency(variant, warmup)
        timed = await caller.latency(variant, latency)
        loaded = await caller.throughput(variant, throughput, concurrency)
    finally:
        await caller.close()
    answer = {"latency": timed["samples"], "calls": loaded["calls"], "wall_s": loaded["wall_s"]}
    print(json.dumps(answer), flush=True)


def main(argv: Sequence[str]) -> None:
    """``serve STATE_DIR`` or ``drive ENDPOINTS SECRET VARIANT WARMUP LATENCY THROUGHPUT
    CONCURRENCY``: Stratagem's side of the harness."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if argv[0] == "serve":
        asyncio.run(_serve(argv[1]))
    elif argv[0] == "drive":
        endpoints, secret_file, variant, *counts = argv[1:]
        warmup, latency, throughput, concurrency = (int(n) for n in counts)
        asyncio.run(
            _drive_ours(endpoints, secret_file, variant, warmup, latency, throughput, concurrency)
        )
    else:
        raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
