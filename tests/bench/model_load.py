"""The model path under load: four agents planning at once against the embedded model server.

Each of the four agents runs in a process of its own (as a deployment's actors do), with the model
planner a deployment gives it (``runtime.host._models.attach_model_planner``: the same client,
limits and queue). Between them and the server (llama.cpp's Python server, Gemma 3 270M on the CPU)
sits a measuring proxy (``tests/bench/model_proxy.py``) that keeps the server's own one-at-a-time
order and sees when the server works on what. All four start planning at the same moment and plan
the demo goal's request of their role ``plans`` times each (the orchestrator its decomposition,
perception its reading of the passage, strategic the arc, tactical the last beat's sequence), each
planning under its caller's deadline.

The figure is the share of the server's time spent on answers a client received (target: at least
90%); the rest went into answers abandoned by a client whose time ran out (and generated anyway,
or cut at the next token), and into the probes that show the server free again. Per agent: how its
plannings ended (the model's plan, the agent's own after refusals, a failure, the caller's
deadline) and their wall time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Final

from tests.bench.model_proxy import MeasuringProxy

__all__ = ["model_load_section", "run_model_load_benchmark"]

logger = logging.getLogger(__name__)

REPO: Final = Path(__file__).resolve().parents[2]
TARGET_SHARE: Final = 0.90
"""The share of model time spent on answers that were used, at least (the issue's target)."""


def _requests() -> dict[str, tuple[str, dict[str, Any]]]:
    """Each role's request for the demo goal, as the orchestrator's pipeline makes them (from a
    run of the deterministic planners in this process)."""
    from stratagem.agents import DEMO_GOAL, build_in_memory
    from stratagem.protocol import CallContext

    agents, dispatcher = build_in_memory(entry_points=False)
    goal = DEMO_GOAL.model_copy(update={"plan_id": "goal-requests"})
    context = CallContext(
        caller="operator", target="orchestrator", capability="SubmitGoal", request_id="r"
    )
    asyncio.run(agents["orchestrator"].handle("SubmitGoal", goal, context))
    # The requests the pipeline sent, references resolved: the last of each capability.
    sent = {call.capability: call.request.model_dump(mode="json") for call in dispatcher.calls}
    return {
        "orchestrator": ("SubmitGoal", DEMO_GOAL.model_dump(mode="json")),
        "perception": ("ExtractEntities", sent["ExtractEntities"]),
        "strategic": ("PlanNarrativeArc", sent["PlanNarrativeArc"]),
        "tactical": ("PlanExecutionSequence", sent["PlanExecutionSequence"]),
    }


def _wait_settled(proxy: MeasuringProxy, limit_s: float) -> None:
    """Until every request the proxy forwarded has ended (a non-streamed answer a client left is
    still generated to its end)."""
    stop = time.monotonic() + limit_s
    while time.monotonic() < stop:
        with proxy._lock:
            if all(record.ended for record in proxy.records):
                return
        time.sleep(0.5)


def run_model_load_benchmark(
    *,
    plans: int = 2,
    timeout_s: float = 60.0,
    deadline_s: float = 300.0,
    max_tokens: int = 160,
    repairs: int = 1,
) -> dict[str, Any]:
    """Run the four agents against the embedded model server (or ``STRATAGEM_BENCH_MODEL_URL``).

    Args:
        plans: Plannings per agent, one after another.
        timeout_s: ``STRATAGEM_MODEL_TIMEOUT_S`` (its default).
        deadline_s: Each planning's caller's deadline (half the step timeout a model-planned
            deployment gives a cross-agent step).
        max_tokens: ``STRATAGEM_MODEL_MAX_TOKENS``.
        repairs: ``STRATAGEM_MODEL_MAX_REPAIRS``.
    """
    from tests.bench.quality import _MODEL_SH, _start_model_server

    requests = _requests()
    model, env, skipped = _start_model_server()
    if model is None:
        logger.warning("model-load: skipped: %s", skipped)
        return {"skipped": skipped}
    upstream = int(model["url"].rsplit(":", 1)[1].split("/", 1)[0])
    proxy = MeasuringProxy(upstream).start()
    state = Path(tempfile.mkdtemp(prefix="stratagem-bench-model-load-"))
    settings = {
        "state_dir": str(state),
        "planner": "model",
        "model_url": f"http://127.0.0.1:{proxy.port}/v1",
        "model": model["model"],
        "model_schema_style": "json_object",
        "model_max_concurrent": 1,
        "model_timeout_s": timeout_s,
        "model_max_tokens": max_tokens,
        "model_max_repairs": repairs,
    }
    started = time.perf_counter()
    try:
        processes = {}
        for role, (capability, request) in requests.items():
            job = {
                "role": role,
                "capability": capability,
                "request": request,
                "plans": plans,
                "deadline_s": deadline_s,
                "settings": settings,
            }
            processes[role] = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.model_load_agent", json.dumps(job)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "RAY_AUTH_MODE": "disabled"},
            )
        for process in processes.values():
            assert process.stdout is not None
            json.loads(process.stdout.readline())  # ready
        started = time.perf_counter()
        for process in processes.values():
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        plannings: dict[str, list[dict[str, Any]]] = {}
        for role, process in processes.items():
            out, _ = process.communicate(timeout=plans * deadline_s + 600)
            plannings[role] = [json.loads(line) for line in out.splitlines() if line.strip()]
        wall = time.perf_counter() - started
        _wait_settled(proxy, 300)
        unfinished = proxy.unfinished()
        if unfinished:
            logger.warning("model-load: still forwarded, not ended: %s", unfinished)
    finally:
        proxy.stop()
        if env:
            subprocess.run(
                ["bash", str(_MODEL_SH), "stop"], capture_output=True, timeout=120, env=env
            )
    figures = proxy.figures()
    share = figures["used_share"]
    walls = [p["wall_s"] for entries in plannings.values() for p in entries]
    result = {
        "model": model["model"],
        "config": {
            "agents": len(requests),
            "plans_per_agent": plans,
            "model_timeout_s": timeout_s,
            "deadline_s": deadline_s,
            "max_tokens": max_tokens,
            "max_repairs": repairs,
        },
        "wall_s": round(wall, 1),
        "server": figures,
        "plannings": {
            role: {
                "outcomes": _count(p["outcome"] for p in entries),
                "wall_s": [p["wall_s"] for p in entries],
                "model_calls": sum(p.get("calls", 0) for p in entries),
            }
            for role, entries in plannings.items()
        },
        "planning_wall_p50_s": round(statistics.median(walls), 1) if walls else None,
        "target": {"min_share": TARGET_SHARE},
        "met": share is not None and share >= TARGET_SHARE,
        "run": uuid.uuid4().hex[:8],
    }
    logger.info(
        "model-load: %.1f%% of %.0f s of model time on answers received (%d delivered, "
        "%d abandoned, %d dropped unsent)",
        100 * (share or 0.0),
        figures["model_s"],
        figures["requests"]["delivered"],
        figures["requests"]["abandoned"],
        figures["requests"]["dropped_unsent"],
    )
    return result


def _count(values: Any) -> dict[str, int]:
    counted: dict[str, int] = {}
    for value in values:
        counted[value] = counted.get(value, 0) + 1
    return counted


def model_load_section(result: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's model-path section."""
    lines = ["## The model path under load: four agents, one CPU model server", ""]
    if not result:
        return [*lines, "Not measured in this run.", ""]
    if "skipped" in result:
        return [*lines, f"Skipped: {result['skipped']}.", ""]
    config, server = result["config"], result["server"]
    share = server["used_share"]
    lines += [
        f"How it was measured (`tests/bench/model_load.py`): the {config['agents']} agents, each "
        "in a process of its own with the model planner a deployment gives it, plan the demo "
        f"goal's request of their role {config['plans_per_agent']} times each, all starting at "
        f"once, against the embedded server ({result['model']}); model timeout "
        f"{config['model_timeout_s']:g} s, each planning's deadline {config['deadline_s']:g} s, "
        f"{config['max_tokens']} tokens an answer, {config['max_repairs']} repair(s). A proxy "
        "that keeps the server's one-at-a-time order measures the server's time per request.",
        "",
        "| model time s | on answers received s | abandoned s | probes s | share used | target |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {server['model_s']} | {server['used_s']} | {server['abandoned_s']} | "
        f"{server['probe_s']} | {share:.1%} | at least {result['target']['min_share']:.0%}: "
        f"{'met' if result['met'] else 'not met'} |"
        if share is not None
        else "| - | - | - | - | - | - |",
        "",
        f"Requests: {server['requests']['delivered']} answered, {server['requests']['abandoned']}"
        f" abandoned, {server['requests']['dropped_unsent']} dropped before they were sent, "
        f"{server['requests']['probes']} probes; {result['wall_s']} s in all.",
        "",
        "| agent | plannings | model calls | wall s |",
        "| --- | --- | ---: | --- |",
    ]
    for role, entry in result["plannings"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(entry["outcomes"].items()))
        walls = ", ".join(f"{w:.1f}" for w in entry["wall_s"])
        lines.append(f"| {role} | {outcomes} | {entry['model_calls']} | {walls} |")
    lines.append("")
    return lines
