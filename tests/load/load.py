"""Load: 64 concurrent callers against one agent, below and above its admission limit.

``python -m tests.load.load [--seconds 60]`` (``make load``). The agent is the real perception agent
(``build_agent("perception")``) behind an ``AgentServer`` with token authentication and a SQLite
audit log, served by a child process (``python -m tests.load.load serve``), so the server and the
load generator share the machine's cores the way two deployed processes would. The generator runs
64 callers, each an ``AgentClient`` with the orchestrator's token sending
``FindSpatialContext(entity_ids=["mira"])`` in a closed loop (the next call as soon as the last one
ends, no back-off) over real sockets, for ``--seconds`` per phase:

- ``below``: the server admits 64 running + 64 queued, so 64 callers never exceed it: every call
  must succeed;
- ``above``: the server admits 16 running + 16 queued, so about half of the 64 callers' calls find
  it full: ``RESOURCE_EXHAUSTED`` must appear, at once, and nothing else may fail.

Reported per phase (printed and written to ``.bench/load.json``): calls, outcomes by status code,
throughput of successful calls, and p50/p99 latency of successful and of refused calls. The exit
status is 1 when a phase breaks its rule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from stratagem.agents import build_agent
from stratagem.protocol import (
    AgentClient,
    AgentServer,
    ClientConfig,
    ClusterSecret,
    FindSpatialContextRequest,
    Policy,
    RemoteError,
    ServerConfig,
    SqliteAuditLog,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
)

CALLERS: Final = 64
CALLER: Final = "orchestrator"  # the shipped policy lets it ask perception for FindSpatialContext
CAPABILITY: Final = "FindSpatialContext"
REQUEST: Final = FindSpatialContextRequest(entity_ids=["mira"])
CALL_TIMEOUT_S: Final = 30.0
OUTPUT: Final = Path(".bench") / "load.json"


@dataclass(frozen=True)
class Phase:
    name: str
    callers: int
    max_concurrent_requests: int
    max_queued_requests: int
    rule: str


PHASES: Final = (
    Phase("below", CALLERS, 64, 64, "zero errors"),
    Phase("above", CALLERS, 16, 16, "RESOURCE_EXHAUSTED appears, nothing else fails"),
)


@dataclass
class PhaseResult:
    name: str
    rule: str
    callers: int
    max_concurrent_requests: int
    max_queued_requests: int
    seconds: float
    calls: int = 0
    codes: dict[str, int] = field(default_factory=dict)
    ok_per_s: float = 0.0
    calls_per_s: float = 0.0
    ok_p50_ms: float | None = None
    ok_p99_ms: float | None = None
    refused_p50_ms: float | None = None
    refused_p99_ms: float | None = None
    passed: bool = False
    failures: list[str] = field(default_factory=list)


# --- the served agent (child process) -----------------------------------------------------------


async def serve(secret_file: Path, state: Path, max_concurrent: int, max_queued: int) -> None:
    """Serve the perception agent until stdin closes; print the port first."""
    agent = build_agent("perception", entry_points=False)
    audit = SqliteAuditLog(state / "audit.sqlite")
    server = AgentServer(
        agent,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(TokenSigner(ClusterSecret.load_or_create(secret_file))),
        audit=audit,
        config=ServerConfig(
            max_concurrent_requests=max_concurrent,
            max_queued_requests=max_queued,
            default_deadline_s=CALL_TIMEOUT_S,
        ),
    )
    port = await server.start()
    print(f"PORT {port}", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # the generator closes our stdin when it is done
    await server.aclose()
    await agent.aclose()
    audit.close()


# --- the load generator -------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


async def _start_server(phase: Phase, secret_file: Path, state: Path) -> tuple[Any, int]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.load.load",
        "serve",
        "--secret-file",
        str(secret_file),
        "--state",
        str(state),
        "--max-concurrent",
        str(phase.max_concurrent_requests),
        "--max-queued",
        str(phase.max_queued_requests),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    if not line.startswith(b"PORT "):
        child.kill()
        raise RuntimeError(f"the agent process did not start: {line!r}")
    return child, int(line.split()[1])


async def _stop_server(child: Any) -> None:
    assert child.stdin is not None
    child.stdin.close()
    try:
        await asyncio.wait_for(child.wait(), 30)
    except TimeoutError:
        child.kill()
        await child.wait()


async def run_phase(phase: Phase, seconds: float, secret_file: Path, state: Path) -> PhaseResult:
    signer = TokenSigner(ClusterSecret.load_or_create(secret_file))
    child, port = await _start_server(phase, secret_file, state / phase.name)
    codes: Counter[str] = Counter()
    ok_latencies: list[float] = []
    refused_latencies: list[float] = []
    clients = [
        AgentClient(
            f"127.0.0.1:{port}",
            credentials=TokenCredentials(signer, CALLER),
            config=ClientConfig(default_timeout_s=CALL_TIMEOUT_S),
        )
        for _ in range(phase.callers)
    ]
    # One call each first, so connections are up before the clock starts.
    await asyncio.gather(*(client.health() for client in clients))
    stop_at = 0.0

    async def caller(client: AgentClient) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                await client.call("perception", CAPABILITY, REQUEST)
            except RemoteError as error:
                elapsed = time.perf_counter() - started
                codes[error.code.value] += 1
                if error.code.value == "RESOURCE_EXHAUSTED":
                    refused_latencies.append(elapsed)
            else:
                elapsed = time.perf_counter() - started
                codes["OK"] += 1
                ok_latencies.append(elapsed)

    started = time.perf_counter()
    stop_at = started + seconds
    try:
        await asyncio.gather(*(caller(client) for client in clients))
        wall = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
        await _stop_server(child)

    result = PhaseResult(
        name=phase.name,
        rule=phase.rule,
        callers=phase.callers,
        max_concurrent_requests=phase.max_concurrent_requests,
        max_queued_requests=phase.max_queued_requests,
        seconds=round(wall, 2),
        calls=sum(codes.values()),
        codes=dict(codes),
        ok_per_s=round(codes["OK"] / wall, 1),
        calls_per_s=round(sum(codes.values()) / wall, 1),
    )
    for name, values in (("ok", ok_latencies), ("refused", refused_latencies)):
        for q in (0.5, 0.99):
            value = _percentile(values, q)
            setattr(
                result,
                f"{name}_p{int(q * 100)}_ms",
                None if value is None else round(value * 1000, 2),
            )
    others = {code: n for code, n in codes.items() if code not in ("OK", "RESOURCE_EXHAUSTED")}
    if others:
        result.failures.append(f"calls failed with {others}")
    if phase.name == "below" and codes["RESOURCE_EXHAUSTED"]:
        result.failures.append(f"{codes['RESOURCE_EXHAUSTED']} calls refused below the limit")
    if phase.name == "above" and not codes["RESOURCE_EXHAUSTED"]:
        result.failures.append("no call was refused above the limit")
    if not codes["OK"]:
        result.failures.append("no call succeeded")
    result.passed = not result.failures
    return result


async def generate(seconds: float) -> list[PhaseResult]:
    with tempfile.TemporaryDirectory(prefix="stratagem-load-") as folder:
        root = Path(folder)
        secret_file = root / "cluster.secret"
        ClusterSecret.load_or_create(secret_file)
        return [await run_phase(phase, seconds, secret_file, root) for phase in PHASES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.load.load", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="duration of each phase")
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("serve", help="(internal) serve the agent of one phase")
    child.add_argument("--secret-file", type=Path, required=True)
    child.add_argument("--state", type=Path, required=True)
    child.add_argument("--max-concurrent", type=int, required=True)
    child.add_argument("--max-queued", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        asyncio.run(serve(args.secret_file, args.state, args.max_concurrent, args.max_queued))
        return 0

    results = asyncio.run(generate(args.seconds))
    report = {
        "callers": CALLERS,
        "capability": CAPABILITY,
        "agent": "perception (build_agent, served in a child process)",
        "auth": "token",
        "cpus": os.cpu_count(),
        "phases": [asdict(result) for result in results],
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for result in results:
        verdict = "ok" if result.passed else "FAILED: " + "; ".join(result.failures)
        print(
            f"{result.name:>6}: {result.ok_per_s:8.1f} ok/s  p50 {result.ok_p50_ms} ms  "
            f"p99 {result.ok_p99_ms} ms  codes {result.codes}  ({result.rule}: {verdict})"
        )
    return 0 if all(result.passed for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
