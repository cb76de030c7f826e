"""``python -m tests.bench``: run every benchmark, write the results, print them.

The results go to ``.bench/results.json`` and ``BENCHMARKS.md`` and, as JSON, to standard output;
progress goes to standard error. The exit status is 0 whether or not the targets are met: the
verdicts are in the results.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Before Ray is imported: the embedded Ray runs without token authentication or usage reporting.
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

from tests.bench.artifacts import artifacts_section, run_artifacts_benchmark
from tests.bench.auth import run_auth_benchmark
from tests.bench.cli import run_cli_benchmark
from tests.bench.cluster import run_cluster_benchmark
from tests.bench.console import console_section, run_console_benchmark
from tests.bench.durable import run_durable_benchmark
from tests.bench.dynamic import run_map_benchmark, run_workflow_benchmark
from tests.bench.engine import run_engine_benchmark
from tests.bench.goal_routing import goal_routing_section, run_goal_routing_benchmark
from tests.bench.history import run_history_benchmark
from tests.bench.memory import HEADING as MEMORY_HEADING
from tests.bench.memory import memory_section, run_memory_benchmark
from tests.bench.model_load import model_load_section, run_model_load_benchmark
from tests.bench.peers import run_peers_benchmark
from tests.bench.quality import quality_section, run_quality_benchmark
from tests.bench.report import (
    MARKDOWN_PATH,
    RESULTS_PATH,
    auth_section,
    cli_section,
    cluster_section,
    dynamic_section,
    history_section,
    machine_facts,
    peers_section,
    rpc_section,
    tracing_section,
    verdicts,
    write_outputs,
)
from tests.bench.research import research_section, run_research_benchmark
from tests.bench.rpc import run_rpc_benchmark
from tests.bench.tracing import run_tracing_benchmark

logger = logging.getLogger("tests.bench")


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("bench %(relativeCreated)7.0fms  %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _tracing() -> dict[str, Any]:
    """The tracing-overhead section, against the Phoenix ``make otel-backend`` runs (if it runs)."""
    from pathlib import Path

    from stratagem.runtime.config._settings import default_state_dir
    from stratagem.runtime.telemetry._backend import find_backend

    state_dir = os.environ.get("STRATAGEM_STATE_DIR")
    backend = find_backend(Path(state_dir) if state_dir else default_state_dir())
    if backend is None:
        logger.info("tracing: skipped, no backend runs (make otel-backend)")
        return {"skipped": "no OTLP backend was running: start one with make otel-backend"}
    logger.info("tracing: engine and request with OTLP to %s vs tracing off", backend.otlp_endpoint)
    tracing = run_tracing_benchmark(backend.otlp_endpoint)
    for part in ("engine", "request"):
        logger.info("tracing: %s +%.0f%% with tracing on", part, tracing[part]["added"] * 100)
    return tracing


def _only_tracing() -> int:
    """``python -m tests.bench tracing``: this section alone, merged into the last results."""
    _log_to_stderr()
    results: dict[str, Any] = (
        json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {"benchmarks": {}}
    )
    results["benchmarks"]["tracing"] = _tracing()
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    # The other sections of BENCHMARKS.md stay as their own run wrote them.
    markdown = MARKDOWN_PATH.read_text(encoding="utf-8") if MARKDOWN_PATH.exists() else ""
    kept = markdown.split("## Tracing overhead", 1)[0].rstrip("\n")
    section = "\n".join(tracing_section(results["benchmarks"]["tracing"]))
    MARKDOWN_PATH.write_text(f"{kept}\n\n{section}".lstrip("\n").rstrip("\n") + "\n")
    json.dump(results["benchmarks"]["tracing"], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _rpc() -> dict[str, Any]:
    """The request path: actor to actor through the pipeline vs a bare grpc.aio echo."""
    logger.info("rpc: actor to actor through the pipeline vs a bare grpc.aio echo")
    # The audit files go under .bench/: the file system the default state directory is on.
    rpc = run_rpc_benchmark(state_parent=RESULTS_PATH.parent)
    for target in rpc["targets"]:
        logger.info(
            "rpc: %s at %.2fx the echo's %s",
            target["variant"],
            target["ratio"],
            target.get("measure", "latency"),
        )
    return rpc


def _only_rpc() -> int:
    """``python -m tests.bench rpc``: this section alone, merged into the last results."""
    return _only_section(
        "rpc", _rpc, "## 1. Cross-agent request latency and throughput", rpc_section
    )


def _auth() -> dict[str, Any]:
    """The cost-of-security section: auth off, token auth and mTLS, interleaved in one run."""
    logger.info("auth: the constant pipeline with auth off, token auth and mTLS, interleaved")
    # The secret, certificates and audit files go under .bench/, as the rpc section's do.
    auth = run_auth_benchmark(state_parent=RESULTS_PATH.parent)
    for mode, ratio in auth["ratios"].items():
        logger.info(
            "auth: %s at %.2fx auth off's median latency, %.2fx its throughput",
            mode,
            ratio["median_latency"],
            ratio["throughput"],
        )
    return auth


def _only_auth() -> int:
    """``python -m tests.bench auth``: this section alone, merged into the last results."""
    return _only_section("auth", _auth, "## Cost of security", auth_section)


def _cluster() -> dict[str, Any]:
    """Goals on a local three-node Ray cluster: 1, 4 and 16 in flight, SQLite and PostgreSQL."""
    logger.info("cluster: goals/s and per-goal latency by goals in flight, SQLite and PostgreSQL")
    cluster = {"machine": machine_facts(), **run_cluster_benchmark()}
    for store, figures in cluster["stores"].items():
        for level, item in figures.items():
            logger.info(
                "cluster: %s, %s in flight: %.2f goals/s, median %.0f ms (%.2fx 1 in flight)",
                store,
                level,
                item["goals_per_s"],
                item["latency_ms"]["median"],
                item["vs_first_level"]["median_latency"],
            )
    return cluster


def _only_cluster() -> int:
    """``python -m tests.bench cluster``: this section alone, merged into the last results."""
    return _only_section(
        "cluster", _cluster, "## Goals on a multi-node Ray cluster", cluster_section
    )


def _peers() -> dict[str, Any]:
    """Stratagem's pipelines beside AutoGen's gRPC runtime and the A2A SDK, one harness."""
    logger.info("peers: echo, Stratagem's pipelines, AutoGen's runtime and A2A, same harness")
    peers = run_peers_benchmark(folder=RESULTS_PATH.parent / "peers")
    peers["workflow"] = _section("workflow", _workflow)
    if "skipped" in peers:
        logger.info("peers: %s", peers["skipped"])
        return peers
    for name, ratio in peers["ratios"].items():
        logger.info(
            "peers: %s at %.2fx the echo's median latency, %.2fx its throughput",
            name,
            ratio["median_latency"],
            ratio["throughput"],
        )
    return peers


def _dynamic() -> dict[str, Any]:
    """A map over 10,000 items: per-item cost against a plain step, peak RSS."""
    logger.info("dynamic: a map over 10,000 items vs 10,000 plain steps; peak RSS")
    dynamic = run_map_benchmark()
    logger.info(
        "dynamic: %.2f us/item vs %.2f us/step (%.2fx); peak RSS %.1f MiB",
        dynamic["per_item_us"]["map"]["median"],
        dynamic["per_item_us"]["plain"]["median"],
        dynamic["ratio"],
        dynamic["peak_rss_mib"]["map"],
    )
    return dynamic


def _only_dynamic() -> int:
    """``python -m tests.bench dynamic``: this section alone, merged into the last results."""
    return _only_section("dynamic", _dynamic, "## Dynamic steps", dynamic_section)


def _workflow() -> dict[str, Any]:
    """The branch-and-map workflow beside LangGraph's, each without and with SQLite."""
    logger.info("workflow: a branch-and-map plan beside the same LangGraph graph")
    workflow = run_workflow_benchmark(folder=RESULTS_PATH.parent / "peers")
    if "ratios" in workflow:
        logger.info("workflow: Stratagem over LangGraph %s", workflow["ratios"])
    return workflow


def _only_workflow() -> int:
    """``python -m tests.bench workflow``: the peers section's workflow part alone, merged into
    the last results (the RPC peers as their own run wrote them)."""
    results: dict[str, Any] = (
        json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {"benchmarks": {}}
    )
    peers = dict(results["benchmarks"].get("peers") or {})

    def measure() -> dict[str, Any]:
        return {**peers, "workflow": _workflow()}

    return _only_section("peers", measure, "## Peers", peers_section)


def _cli() -> dict[str, Any]:
    """``--help`` and ``request`` wall time against a running local deployment."""
    logger.info("cli: --help and request against a local deployment, whole processes")
    cli = run_cli_benchmark()
    for target in cli.get("targets", []):
        logger.info("cli: %s median %.3f s", target["command"], target["median_s"])
    return cli


def _only_cli() -> int:
    """``python -m tests.bench cli``: this section alone, merged into the last results."""
    return _only_section("cli", _cli, "## Command-line start", cli_section)


def _history() -> dict[str, Any]:
    """Pages of the history out of 10,000 stored plans, SQLite and PostgreSQL."""
    logger.info("history: one page of 10,000 stored plans through the operator API")
    history = run_history_benchmark()
    for target in history["targets"]:
        logger.info(
            "history: %s first page median %.1f ms (target %.0f ms)",
            target["store"],
            target["median_ms"],
            target["max_ms"],
        )
    return history


def _memory() -> dict[str, Any]:
    """Memory recall over 100,000 items, SQLite and PostgreSQL."""
    logger.info("memory: recall over 100,000 items through the store's API")
    memory = run_memory_benchmark()
    for target in memory["targets"]:
        logger.info(
            "memory: %s recall p50 %.2f ms (target %.0f ms)",
            target["store"],
            target["p50_ms"],
            target["max_ms"],
        )
    return memory


def _only_history() -> int:
    """``python -m tests.bench history``: this section alone, merged into the last results."""
    return _only_section(
        "history", _history, "## History: one page of 10,000 stored plans", history_section
    )


def _only_console() -> int:
    """``python -m tests.bench console``: the web console's section alone, merged into the last
    results."""
    return _only_section("console", run_console_benchmark, "## Web console", console_section)


def _artifacts() -> dict[str, Any]:
    """Artifacts: save/load of 1 MiB and 100 MiB vs copying; a saving step vs an inline one."""
    logger.info("artifacts: save and load vs copying the file; a saving step vs an inline one")
    artifacts = run_artifacts_benchmark(folder=RESULTS_PATH.parent)
    for target in artifacts["targets"]:
        logger.info("artifacts: %s at %.2fx", target["what"], target["ratio"])
    return artifacts


def _only_artifacts() -> int:
    """``python -m tests.bench artifacts``: this section alone, merged into the last results."""
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    return _only_section("artifacts", _artifacts, "## Artifacts", artifacts_section)


def _only_peers() -> int:
    """``python -m tests.bench peers``: this section alone, merged into the last results."""
    return _only_section("peers", _peers, "## Peers", peers_section)


def _section(name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A section of the full run; one that fails is recorded as skipped with its reason (one
    line), so the sections measured before and after it still reach BENCHMARKS.md."""
    try:
        return measure()
    except Exception as exc:
        reason = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        )
        logger.error("%s: failed, recorded as skipped: %s", name, reason[:300])
        return {"skipped": f"the run failed ({reason[:300]})"}


def _only_quality() -> int:
    """``python -m tests.bench quality``: this section alone, merged into the last results."""
    return _only_section("quality", run_quality_benchmark, "## Planning quality", quality_section)


def _only_goals() -> int:
    """``python -m tests.bench goals``: this section alone, merged into the last results."""
    return _only_section(
        "goals", run_goal_routing_benchmark, "## Goals in plain words", goal_routing_section
    )


def _only_research() -> int:
    """``python -m tests.bench research``: this section alone, merged into the last results."""
    return _only_section("research", run_research_benchmark, "## Research:", research_section)


def _only_model_load() -> int:
    """``python -m tests.bench model-load``: this section alone, merged into the last results."""
    return _only_section(
        "model_load",
        run_model_load_benchmark,
        "## The model path under load",
        model_load_section,
    )


def _only_section(
    name: str,
    measure: Callable[[], dict[str, Any]],
    heading: str,
    render: Callable[[dict[str, Any] | None], list[str]],
) -> int:
    """One section alone, merged into the last results: its key in ``.bench/results.json``, its
    part of ``BENCHMARKS.md`` replaced (or added before the tracing section); the rest as their
    own run wrote them."""
    _log_to_stderr()
    results: dict[str, Any] = (
        json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {"benchmarks": {}}
    )
    results["benchmarks"][name] = measure()
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    markdown = MARKDOWN_PATH.read_text(encoding="utf-8") if MARKDOWN_PATH.exists() else ""
    before, found, after = markdown.partition(heading)
    if found:
        rest = after.partition("\n## ")
        after = f"\n## {rest[2]}" if rest[1] else ""
    else:
        before, found, after = markdown.partition("## Tracing overhead")
        after = found + after
    section = "\n".join(render(results["benchmarks"][name])).rstrip("\n")
    parts = (before.rstrip("\n"), section, after.strip("\n"))
    MARKDOWN_PATH.write_text("\n\n".join(part for part in parts if part) + "\n")
    json.dump(results["benchmarks"][name], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def main() -> int:
    """Run every benchmark; write the results and print them."""
    if sys.argv[1:] == ["tracing"]:
        return _only_tracing()
    if sys.argv[1:] == ["rpc"]:
        return _only_rpc()
    if sys.argv[1:] == ["auth"]:
        return _only_auth()
    if sys.argv[1:] == ["cluster"]:
        return _only_cluster()
    if sys.argv[1:] == ["peers"]:
        return _only_peers()
    if sys.argv[1:] == ["console"]:
        return _only_console()
    if sys.argv[1:] == ["cli"]:
        return _only_cli()
    if sys.argv[1:] == ["quality"]:
        return _only_quality()
    if sys.argv[1:] == ["dynamic"]:
        return _only_dynamic()
    if sys.argv[1:] == ["workflow"]:
        return _only_workflow()
    if sys.argv[1:] == ["history"]:
        return _only_history()
    if sys.argv[1:] == ["memory"]:
        return _only_section("memory", _memory, MEMORY_HEADING, memory_section)
    if sys.argv[1:] == ["model-load"]:
        return _only_model_load()
    if sys.argv[1:] == ["goals"]:
        return _only_goals()
    if sys.argv[1:] == ["research"]:
        return _only_research()
    if sys.argv[1:] == ["artifacts"]:
        return _only_artifacts()
    _log_to_stderr()
    started = time.perf_counter()
    machine = machine_facts()
    logger.info(
        "machine: %s cores, %s, ray %s, grpcio %s",
        machine["cores"],
        machine["python"],
        machine["packages"]["ray"],
        machine["packages"]["grpcio"],
    )
    # The engine first, in this process before Ray starts, so no Ray process competes for CPU.
    logger.info("engine: 1,000-step layered plan vs a bare asyncio loop")
    engine = run_engine_benchmark()
    logger.info(
        "engine: %.2f us/step vs bare %.2f us/step (%.2fx)",
        engine["variants"]["engine_noop_tracer"]["per_step_us"]["median"],
        engine["variants"]["bare_loop"]["per_step_us"]["median"],
        engine["ratios"]["engine_noop_tracer"],
    )
    logger.info("durable: the same plan with SqliteStateStore checkpoints vs none; store size")
    durable = run_durable_benchmark(folder=RESULTS_PATH.parent / "durable")
    for name, ratio in durable["ratios"].items():
        logger.info("durable: %s at %.2fx the store-free engine per step", name, ratio)
    size = durable["store_size"]
    logger.info(
        "durable: %d -> %d bytes for %d -> %d steps (%.2fx)",
        size["small"]["bytes"],
        size["large"]["bytes"],
        size["small"]["steps"],
        size["large"]["steps"],
        size["growth"]["bytes"],
    )
    dynamic = _section("dynamic", _dynamic)
    rpc = _rpc()
    auth = _section("auth", _auth)
    cluster = _section("cluster", _cluster)
    peers = _section("peers", _peers)
    cli = _section("cli", _cli)
    history = _section("history", _history)
    memory = _section("memory", _memory)
    artifacts = _section("artifacts", _artifacts)
    logger.info("quality: the goal suite with the deterministic and the model planners")
    quality = _section("quality", run_quality_benchmark)
    logger.info("goals: goals in plain words, routed and planned by the deterministic planner")
    goals = _section("goals", run_goal_routing_benchmark)
    logger.info("research: the question suite over docs/, citation precision and recall")
    research = _section("research", run_research_benchmark)
    logger.info("model-load: four agents planning at once against the embedded model server")
    model_load = _section("model_load", run_model_load_benchmark)
    results: dict[str, Any] = {
        "schema": 1,
        "machine": machine,
        "duration_s": round(time.perf_counter() - started, 1),
        "verdicts": verdicts(rpc, engine, durable),
        "benchmarks": {"rpc": rpc, "engine": engine, "durable": durable, "tracing": _tracing()},
    }
    results["benchmarks"]["auth"] = auth
    results["benchmarks"]["cluster"] = cluster
    results["benchmarks"]["dynamic"] = dynamic
    results["benchmarks"]["peers"] = peers
    results["benchmarks"]["cli"] = cli
    results["benchmarks"]["history"] = history
    results["benchmarks"]["memory"] = memory
    results["benchmarks"]["artifacts"] = artifacts
    results["benchmarks"]["quality"] = quality
    results["benchmarks"]["goals"] = goals
    results["benchmarks"]["model_load"] = model_load
    results["benchmarks"]["research"] = research
    json_path, markdown_path = write_outputs(results)
    logger.info("wrote %s and %s in %.0f s", json_path, markdown_path, results["duration_s"])
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
