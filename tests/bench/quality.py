"""Planning quality: the goal suite (``tests/bench/goals.yaml``) with the deterministic planners and
with the model planners on the embedded model.

Each goal is a ``SubmitGoal`` to the four real agents in one process (``build_in_memory``: the same
agents, planners, engine and tools a deployment runs, wired through the in-memory dispatcher
instead of gRPC). With ``model`` every agent plans through its model planner
(``agents.model_planner``: the model's answer judged by the agent's deterministic tools, the
agent's own planner the fallback).

Per planner:

* per goal: the outcome (``succeeded``, or the failure's class and its one-line message), whether
  every beat's goals hold in the perception agent's world afterwards (the deterministic verifier),
  whether the facts the goal *means* hold (``expect`` in the suite: "Old Tom goes to the garden"
  moves Old Tom), wall time, and the time spent waiting on the model;
* per agent: model calls, schema-valid first answers (the first call's answer accepted), plans
  accepted from the model (after any repairs) or from the fallback, mean repairs, tokens, and the
  latency of calls (p50, p90);
* what must hold whatever the model is: every plan that ran passes ``validate_plan`` against its
  agent's registry again, and every failure is a named one (a protocol error with a message naming
  the plan and the step).

The runtime's overhead beside the model is the wall time of the model run not spent in model calls,
as a share of the wall time (target: at most 10%).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import yaml

from stratagem.agents import (
    Agent,
    ModelConfig,
    ModelPlanningConfig,
    OpenAIModelClient,
    PerceptionAgent,
    model_planner,
)
from stratagem.agents._roles import build_in_memory
from stratagem.planning import EngineConfig, validate_plan
from stratagem.protocol import (
    ALREADY_HOLDS,
    CallContext,
    Relation,
    RemoteError,
    SubmitGoalRequest,
    SubmitGoalResponse,
)

__all__ = ["GOALS_PATH", "load_suite", "quality_section", "run_quality_benchmark"]

logger = logging.getLogger(__name__)

GOALS_PATH: Final = Path(__file__).with_name("goals.yaml")
_MODEL_SH: Final = Path(__file__).resolve().parents[2] / "scripts" / "model_server.sh"
_FACT: Final = re.compile(r"(\w+)\((\w+),\s*(\w+)\)")
OVERHEAD_TARGET: Final = 0.10
"""The runtime's share of a model-planned goal's wall time, at most (the issue's target)."""
ROLES: Final = ("perception", "strategic", "tactical", "orchestrator")


def load_suite(path: Path = GOALS_PATH) -> list[dict[str, Any]]:
    """The goal suite: ``id``, ``kind``, ``goal``, ``passage``, ``beats``, ``expect`` (facts)."""
    goals: list[dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8"))
    for goal in goals:
        goal["expect"] = [_fact(text) for text in goal.get("expect") or []]
    return goals


def _fact(text: str) -> Relation:
    found = _FACT.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a fact: {text!r} (write predicate(subject, object))")
    predicate, subject, obj = found.groups()
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


def _context() -> CallContext:
    return CallContext(
        caller="operator",
        target="orchestrator",
        capability="SubmitGoal",
        request_id=os.urandom(16).hex(),
        plan_id="",
        step_id="",
    )


async def _one_goal(goal: dict[str, Any], model: dict[str, str] | None) -> dict[str, Any]:
    # As a deployment runs them: a step waiting on model calls may take minutes on a CPU server
    # (`STRATAGEM_STEP_TIMEOUT_S` defaults to 600 s when a model plans, 30 s otherwise).
    config = EngineConfig(default_timeout_s=600.0 if model is not None else 30.0)
    agents, _ = build_in_memory(engine_config=config, entry_points=False)
    if model is not None:
        for agent in agents.values():
            client = OpenAIModelClient(
                ModelConfig(
                    url=model["url"],
                    model=model["model"],
                    schema_style="json_object",
                    timeout_s=120,
                    max_concurrent=1,
                )
            )
            planner = model_planner(
                agent, client, ModelPlanningConfig(max_repairs=2, max_tokens=160)
            )
            if planner is not None:
                agent.use_planner(planner)
    request = SubmitGoalRequest(
        goal=goal["goal"], passage=goal["passage"], beats=goal["beats"], plan_id=f"q-{goal['id']}"
    )
    started = time.perf_counter()
    outcome: dict[str, Any] = {"id": goal["id"], "kind": goal["kind"]}
    try:
        answer = await agents["orchestrator"].handle("SubmitGoal", request, _context())
    except RemoteError as exc:
        outcome.update(status="failed", code=exc.code.value, message=exc.message[:300])
        outcome["named"] = bool(exc.message) and f"plan 'q-{goal['id']}'" in exc.message
        answer = None
    except Exception as exc:  # what must never happen: counted as an unnamed failure
        outcome.update(status="failed", code="UNEXPECTED", message=repr(exc)[:300], named=False)
        answer = None
    outcome["wall_s"] = time.perf_counter() - started
    perception = agents["perception"]
    assert isinstance(perception, PerceptionAgent)
    # The goal's own world: a goal that names none runs in one named after its plan.
    world = perception.worlds.get(request.plan_id)
    if isinstance(answer, SubmitGoalResponse):
        # A goal whose arc held before any action is reached too (nothing was left to do).
        outcome["status"] = "succeeded" if answer.status == ALREADY_HOLDS else answer.status
        outcome["already_held"] = answer.status == ALREADY_HOLDS
        world = perception.worlds.get(answer.world)
        beat_goals = [fact for beat in answer.beats for fact in beat.goals]
        outcome["beats_hold"] = all(world.holds(f) for f in beat_goals)
        outcome["actions"] = [f"{a.name}({','.join(a.args)})" for a in answer.actions]
    outcome["meant"] = bool(goal["expect"]) and all(world.holds(f) for f in goal["expect"])
    outcome["agents"], outcome["invalid_plans"] = _agent_figures(agents)
    outcome["model_s"] = sum(
        call for figures in outcome["agents"].values() for call in figures["latencies_s"]
    )
    return outcome


def _agent_figures(agents: dict[str, Agent]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per agent: its plans' model calls; and every plan that ran but fails validation now."""
    figures: dict[str, dict[str, Any]] = {}
    invalid: list[str] = []
    for role, agent in agents.items():
        entry: dict[str, Any] = {
            "plans": 0,
            "model_plans": 0,
            "from_model": 0,
            "first_valid": 0,
            "repairs": 0,
            "tokens": 0,
            "latencies_s": [],
        }
        for snapshot in agent.plans(""):
            plan = agent.record(snapshot.plan_id).plan
            entry["plans"] += 1
            try:
                validate_plan(plan, tools=agent.registry)
            except Exception as exc:  # a plan that ran must still pass: record which did not
                invalid.append(f"{role} {plan.id}: {exc}")
            provenance = plan.provenance
            if provenance is None or not provenance.calls:
                continue
            entry["model_plans"] += 1
            entry["from_model"] += provenance.author.startswith("model:")
            entry["first_valid"] += provenance.calls[0].outcome == "accepted"
            entry["repairs"] += sum(1 for call in provenance.calls if call.critique)
            for call in provenance.calls:
                entry["tokens"] += call.input_tokens + call.output_tokens
                entry["latencies_s"].append(call.latency_s)
        figures[role] = entry
    return figures, invalid


def _summary(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    by_agent: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        entries = [o["agents"][role] for o in outcomes]
        latencies = sorted(x for e in entries for x in e["latencies_s"])
        model_plans = sum(e["model_plans"] for e in entries)
        by_agent[role] = {
            "plans": sum(e["plans"] for e in entries),
            "model_plans": model_plans,
            "first_valid": sum(e["first_valid"] for e in entries),
            "from_model": sum(e["from_model"] for e in entries),
            "mean_repairs": round(sum(e["repairs"] for e in entries) / model_plans, 2)
            if model_plans
            else 0.0,
            "calls": len(latencies),
            "tokens": sum(e["tokens"] for e in entries),
            "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
            "latency_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 2)
            if latencies
            else None,
        }
    wall = sum(o["wall_s"] for o in outcomes)
    model = sum(o["model_s"] for o in outcomes)
    failed = [o for o in outcomes if o["status"] != "succeeded"]
    return {
        "goals": len(outcomes),
        "succeeded": len(outcomes) - len(failed),
        "beats_hold": sum(1 for o in outcomes if o.get("beats_hold")),
        "meant": sum(1 for o in outcomes if o["meant"]),
        "with_expectation": None,
        "failures_named": sum(1 for o in failed if o.get("named")),
        "failures": len(failed),
        "invalid_plans": [p for o in outcomes for p in o["invalid_plans"]],
        "wall_s": round(wall, 1),
        "model_s": round(model, 1),
        "overhead_share": round((wall - model) / wall, 4) if model and wall else None,
        "by_agent": by_agent,
    }


def _start_model_server() -> tuple[dict[str, str] | None, dict[str, str], str]:
    """The model to use: ``STRATAGEM_BENCH_MODEL_URL``, or the embedded server started here."""
    url = os.environ.get("STRATAGEM_BENCH_MODEL_URL")
    if url:
        return (
            {"url": url, "model": os.environ.get("STRATAGEM_BENCH_MODEL", "gemma-3-270m")},
            {},
            "",
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "MODEL_SERVER_DIR": tempfile.mkdtemp(prefix="stratagem-bench-model-"),
        "MODEL_SERVER_PORT": str(port),
    }
    try:
        started = subprocess.run(
            ["bash", str(_MODEL_SH), "start"],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, {}, f"the embedded model server did not start: {exc}"
    if started.returncode != 0:
        reason = (started.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return None, {}, f"the embedded model server did not start: {reason}"
    return {"url": f"http://127.0.0.1:{port}/v1", "model": "gemma-3-270m"}, env, ""


def run_quality_benchmark(*, model_goals: int | None = None) -> dict[str, Any]:
    """Run the suite with both planner kinds.

    Args:
        model_goals: How many of the suite's goals run with the model planners (``None``: every
            one; ``STRATAGEM_BENCH_QUALITY_MODEL_GOALS`` sets it from ``make bench``). The goals
            are taken alternately from the grammar and the prose ones so a subset keeps both.

    Returns:
        ``suite`` (goal count and kinds), ``deterministic`` and ``model`` (``summary`` and
        ``goals``), or ``model.skipped`` when no model server could be started.
    """
    suite = load_suite()
    if model_goals is None and os.environ.get("STRATAGEM_BENCH_QUALITY_MODEL_GOALS"):
        model_goals = int(os.environ["STRATAGEM_BENCH_QUALITY_MODEL_GOALS"])
    kinds = {kind: sum(1 for g in suite if g["kind"] == kind) for kind in ("grammar", "prose")}
    results: dict[str, Any] = {"suite": {"goals": len(suite), **kinds}}
    quiet = logging.getLogger("stratagem")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the planners' warnings are in the figures
    try:
        return _run_suites(results, suite, model_goals)
    finally:
        quiet.setLevel(level)


def _run_suites(
    results: dict[str, Any], suite: list[dict[str, Any]], model_goals: int | None
) -> dict[str, Any]:

    async def run(
        goals: list[dict[str, Any]], model: dict[str, str] | None
    ) -> list[dict[str, Any]]:
        outcomes = []
        for index, goal in enumerate(goals, start=1):
            outcome = await _one_goal(goal, model)
            logger.info(
                "quality (%s) %d/%d %s: %s in %.1f s",
                "model" if model else "deterministic",
                index,
                len(goals),
                goal["id"],
                outcome["status"],
                outcome["wall_s"],
            )
            outcomes.append(outcome)
        return outcomes

    deterministic = asyncio.run(run(suite, None))
    results["deterministic"] = {"summary": _summary(deterministic), "goals": deterministic}
    _count_expectations(results, suite)
    chosen = _alternating(suite, model_goals)
    if not chosen:
        results["model"] = {"skipped": "no goal was asked to run with the model planners"}
        return results
    model, env, skipped = _start_model_server()
    if model is None:
        logger.warning("quality: model planners skipped: %s", skipped)
        results["model"] = {"skipped": skipped}
        return results
    try:
        outcomes = asyncio.run(run(chosen, model))
    finally:
        if env:
            subprocess.run(
                ["bash", str(_MODEL_SH), "stop"], capture_output=True, timeout=120, env=env
            )
    results["model"] = {
        "model": model["model"],
        "summary": _summary(outcomes),
        "goals": outcomes,
    }
    _count_expectations(results, suite)
    return results


def _count_expectations(results: dict[str, Any], suite: list[dict[str, Any]]) -> None:
    expected = {g["id"] for g in suite if g["expect"]}
    for name in ("deterministic", "model"):
        part = results.get(name) or {}
        if "summary" in part:
            ran = part["goals"]
            part["summary"]["with_expectation"] = sum(1 for o in ran if o["id"] in expected)


def _alternating(suite: list[dict[str, Any]], count: int | None) -> list[dict[str, Any]]:
    if count is None or count >= len(suite):
        return suite
    grammar = [g for g in suite if g["kind"] == "grammar"]
    prose = [g for g in suite if g["kind"] == "prose"]
    chosen: list[dict[str, Any]] = []
    while len(chosen) < count and (grammar or prose):
        for pool in (grammar, prose):
            if pool and len(chosen) < count:
                chosen.append(pool.pop(0))
    return chosen


def quality_section(quality: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's planning-quality section."""
    lines = ["## Planning quality: the goal suite with deterministic and model planners", ""]
    if not quality:
        return [*lines, "Not measured in this run.", ""]
    if "skipped" in quality:
        return [*lines, f"Skipped: {quality['skipped']}.", ""]
    suite = quality["suite"]
    lines += [
        f"How it was measured (`tests/bench/quality.py`, suite `tests/bench/goals.yaml`: "
        f"{suite['goals']} goals, {suite['grammar']} in the rule extractor's sentences and "
        f"{suite['prose']} in ordinary prose): each goal a `SubmitGoal` to the four real agents in "
        "one process (in-memory dispatcher instead of gRPC), first with the agents' own planners, "
        "then with every agent's model planner (2 repairs, 160 tokens an answer; the agent's own "
        "planner the fallback). `beats hold`: every beat's goals hold in the world afterwards "
        "(the deterministic verifier); `meant`: the facts the goal means hold (the suite's "
        "`expect`, for the goals that have one).",
        "",
        "| planner | goals | succeeded | beats hold | meant | failures named | plans failing "
        "validation | wall s | model s | runtime share |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ("deterministic", "model"):
        part = quality.get(name) or {}
        if "skipped" in part:
            lines.insert(-2, f"Model planners skipped: {part['skipped']}.")
            continue
        s = part.get("summary")
        if not s:
            continue
        share = f"{s['overhead_share']:.1%}" if s["overhead_share"] is not None else "-"
        lines.append(
            f"| {name} | {s['goals']} | {s['succeeded']} | {s['beats_hold']} | "
            f"{s['meant']} of {s['with_expectation']} | {s['failures_named']} of {s['failures']} | "
            f"{len(s['invalid_plans'])} | {s['wall_s']} | {s['model_s']} | {share} |"
        )
    model = quality.get("model") or {}
    summary = model.get("summary")
    if summary:
        lines += [
            "",
            f"Per agent, model planners ({model['model']}):",
            "",
            "| agent | plans asked of the model | schema-valid first answers | accepted from the "
            "model | mean repairs | calls | tokens | latency p50 s | p90 s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for role, a in summary["by_agent"].items():
            lines.append(
                f"| {role} | {a['model_plans']} | {a['first_valid']} | {a['from_model']} | "
                f"{a['mean_repairs']} | {a['calls']} | {a['tokens']:,} | "
                f"{a['latency_p50_s'] if a['latency_p50_s'] is not None else '-'} | "
                f"{a['latency_p90_s'] if a['latency_p90_s'] is not None else '-'} |"
            )
        share = summary["overhead_share"]
        if share is not None:
            verdict = "**met**" if share <= OVERHEAD_TARGET else "**not met**"
            lines += [
                "",
                f"- The runtime's own share of the model-planned goals' wall time (not waiting on "
                f"the model): {share:.1%}; target at most {OVERHEAD_TARGET:.0%}: {verdict}.",
            ]
        lines.append(
            "- Whatever the model: plans that ran and fail validation now: "
            f"{len(summary['invalid_plans'])}; failures without a named plan and step: "
            f"{summary['failures'] - summary['failures_named']}."
        )
    lines.append("")
    return lines
