"""Smoke tests of the benchmarks: tiny plans, one repeat, well-formed results.

Only the shape of the results is checked, never a timing: the figures themselves are
``make bench``'s business.
"""

from __future__ import annotations

import asyncio
import math
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from stratagem.agents import DEMO_GOAL, build_in_memory
from stratagem.protocol import CallContext, SubmitGoalResponse
from tests.bench.cli import summarize_cli
from tests.bench.cluster import (
    POSTGRESQL,
    SQLITE,
    ClusterBenchConfig,
    GoalSamples,
    goal_in_own_world,
    summarize_cluster,
)
from tests.bench.durable import (
    IDEMPOTENT,
    NO_STORE,
    SIDE_EFFECTING,
    DurableBenchConfig,
    run_durable_benchmark,
)
from tests.bench.dynamic import DynamicBenchConfig, _map_walls, workflow_plan
from tests.bench.engine import (
    BARE,
    ENGINE_NOOP,
    ENGINE_SDK,
    EngineBenchConfig,
    _scale,
    layered_plan,
    run_engine_benchmark,
)
from tests.bench.peers import VARIANTS as PEER_VARIANTS
from tests.bench.peers import PeersBenchConfig, summarize_peers
from tests.bench.quality import load_suite, quality_section, run_quality_benchmark
from tests.bench.report import (
    _durable_section,
    _rpc_section,
    _verdict_section,
    cli_section,
    cluster_section,
    dynamic_section,
    peers_section,
    verdicts,
)
from tests.bench.rpc import VARIANTS as RPC_VARIANTS
from tests.bench.rpc import RpcBenchConfig, _Samples, _summarize
from tests.bench.stats import summarize


def test_layered_plan_has_the_asked_shape() -> None:
    config = EngineBenchConfig(layers=3, width=5, fan_in=2)
    plan = layered_plan(config)
    assert len(plan.steps) == 15
    assert [len(step.depends_on) for step in plan.steps] == [0] * 5 + [2] * 10
    assert plan.max_in_flight == config.max_in_flight


def test_engine_benchmark_returns_well_formed_results() -> None:
    config = EngineBenchConfig(layers=2, width=10, fan_in=2, repeats=1, warmup=0)
    result = run_engine_benchmark(config)

    assert result["config"]["steps"] == 20
    assert set(result["variants"]) == {BARE, ENGINE_NOOP, ENGINE_SDK}
    for variant in result["variants"].values():
        per_step = variant["per_step_us"]
        assert set(per_step) == {"median", "p99", "min", "max", "mean", "n"}
        assert per_step["n"] == 1
        assert per_step["median"] > 0
        assert variant["run_ms"] > 0
        assert len(variant["samples_us"]) == 1
    assert set(result["ratios"]) == {ENGINE_NOOP, ENGINE_SDK}
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in result["ratios"].values())
    target = result["target"]
    assert target["variant"] == ENGINE_NOOP
    assert target["max_ratio"] == 4.0
    assert target["ratio"] == result["ratios"][ENGINE_NOOP]
    assert isinstance(target["met"], bool)


def test_durable_benchmark_returns_well_formed_results(tmp_path: Path) -> None:
    shape = EngineBenchConfig(layers=2, width=10, fan_in=2, repeats=1, warmup=0)
    config = DurableBenchConfig(plan=shape, small_layers=2, large_layers=4)
    result = run_durable_benchmark(config, folder=tmp_path)

    assert result["config"]["steps"] == 20
    assert (result["config"]["small_steps"], result["config"]["large_steps"]) == (20, 40)
    assert set(result["variants"]) == {NO_STORE, IDEMPOTENT, SIDE_EFFECTING}
    for variant in result["variants"].values():
        assert variant["per_step_us"]["n"] == 1
        assert variant["per_step_us"]["median"] > 0
        assert len(variant["samples_us"]) == 1
    assert set(result["ratios"]) == {IDEMPOTENT, SIDE_EFFECTING}
    assert all(math.isfinite(ratio) and ratio > 0 for ratio in result["ratios"].values())
    target = result["target"]
    assert target["baseline"] == NO_STORE
    assert target["max_ratio"] == 2.5
    assert set(target["variants"]) == {IDEMPOTENT, SIDE_EFFECTING}
    size = result["store_size"]
    assert (size["small"]["steps"], size["large"]["steps"]) == (20, 40)
    for item in (size["small"], size["large"]):
        assert item["plans"] == 1
        assert item["records"] >= 2 * item["steps"]  # an intent and a result per step
        assert 0 < item["bytes"] <= item["file_bytes"]
    assert size["steps_ratio"] == 2.0
    assert size["linear_range"] == [1.6, 2.5]
    assert isinstance(size["linear"], bool)
    found = verdicts({"targets": []}, {"target": {"max_ratio": 4.0}, "ratios": {}}, result)
    assert [item["variant"] for item in found] == [IDEMPOTENT, SIDE_EFFECTING, "store_growth"]
    assert "## 3. Durable checkpoints" in "\n".join(_durable_section(result))


async def test_each_cluster_worker_pursues_the_demo_goal_in_a_world_of_its_own() -> None:
    # The same goal at once in one perception agent's world: distinct worlds do not conflict.
    agents, _ = build_in_memory(entry_points=False)
    goals = [goal_in_own_world(DEMO_GOAL, worker) for worker in range(4)]
    assert goals[0].passage != goals[1].passage
    assert "Mira Bravo" in goals[1].passage
    assert "The iron keybravo lies in the gardenbravo" in goals[1].passage

    async def pursue(index: int) -> object:
        request = goals[index].model_copy(update={"plan_id": f"smoke-{index}"})
        call = CallContext(
            caller="operator",
            target="orchestrator",
            capability="SubmitGoal",
            request_id=uuid.uuid4().hex,
        )
        return await agents["orchestrator"].handle("SubmitGoal", request, call)

    answers = await asyncio.gather(*(pursue(index) for index in range(len(goals))))
    assert all(isinstance(a, SubmitGoalResponse) for a in answers)
    assert [a.status for a in answers if isinstance(a, SubmitGoalResponse)] == ["succeeded"] * 4


def test_cluster_summary_and_section_are_well_formed() -> None:
    config = ClusterBenchConfig(levels=(1, 4), goals={1: 2, 4: 4}, warmup=1)
    samples = {
        store: {
            1: GoalSamples(latencies_s=[0.1, 0.12], wall_s=0.22, busy_cores=0.8),
            4: GoalSamples(
                latencies_s=[0.2, 0.3, 0.3, 0.4],
                wall_s=0.5,
                failures=["bench-x: status failed"],
                busy_cores=1.9,
            ),
        }
        for store in (SQLITE, POSTGRESQL)
    }
    result = summarize_cluster(config, samples)

    assert set(result["stores"]) == {SQLITE, POSTGRESQL}
    level = result["stores"][SQLITE]["4"]
    assert level["goals"] == 4
    assert level["failed"] == 1
    assert level["goals_per_s"] == 8.0
    assert set(level["latency_ms"]) == {"median", "p90", "p99", "min", "max", "mean", "n"}
    assert level["vs_first_level"]["median_latency"] == round(300 / 110, 2)
    assert result["stores"][SQLITE]["1"]["vs_first_level"]["median_latency"] == 1.0
    text = "\n".join(cluster_section({**result, "machine": {"cores": 2}}))
    assert "## Goals on a multi-node Ray cluster" in text
    assert "passes 1.5x of it from 4 in flight" in text
    assert "## Goals on a multi-node Ray cluster" in "\n".join(cluster_section(None))


def test_peers_summary_and_section_are_well_formed() -> None:
    config = PeersBenchConfig(warmup=0, latency_calls=3, throughput_calls=4, rounds=1)
    # Synthetic samples (seconds): shape only, no timing is judged here.
    samples = {name: [0.001 * (index + 1)] * 3 for index, name in enumerate(PEER_VARIANTS)}
    calls = dict.fromkeys(PEER_VARIANTS, 4)
    wall = {name: 0.01 * (index + 1) for index, name in enumerate(PEER_VARIANTS)}
    result = summarize_peers(config, samples, calls, wall)

    assert set(result["variants"]) == set(PEER_VARIANTS)
    assert set(result["ratios"]) == set(PEER_VARIANTS) - {"echo"}
    assert result["ratios"]["autogen"]["median_latency"] == 5.0
    assert result["a2a_face"]["median_latency"] == round(7.0 / 6.0, 2)
    # pipeline_stream against the unary pipeline_constant, and each pipeline against AutoGen.
    assert result["stream_vs_unary"] == {"median_latency": 1.5, "throughput": 0.67}
    assert result["against_autogen"]["pipeline_stream"] == {
        "median_latency": 0.6,
        "throughput": round((4 / 0.03) / (4 / 0.05), 2),
    }
    # The pipelines are faster than AutoGen in these samples; the verdicts say so.
    assert result["targets"]["pipeline_constant_beats_autogen"] == {
        "latency": True,
        "throughput": True,
    }
    text = "\n".join(peers_section(result))
    assert "`autogen`" in text
    assert "`a2a`" in text
    assert "Stratagem's A2A face against the plain A2A SDK server" in text
    assert "`pipeline_stream` against the unary `pipeline_constant`" in text
    assert "`pipeline_stream`: median latency 0.60x AutoGen's" in text
    assert "Not measured" not in text
    assert peers_section({"skipped": "no network"})[-2] == "Skipped: no network."


def test_cli_summary_and_section_are_well_formed() -> None:
    result = summarize_cli({"help": [0.2, 0.25, 0.21], "request": [0.6, 0.7, 0.65]})
    verdict = {item["command"]: item["met"] for item in result["targets"]}
    assert verdict == {"help": True, "request": False}
    text = "\n".join(cli_section(result))
    assert "`help`" in text
    assert "`request`" in text
    assert "**not met**" in text


def test_quality_suite_and_deterministic_run_are_well_formed() -> None:
    suite = load_suite()
    assert len(suite) >= 30
    assert sum(1 for g in suite if g["kind"] == "prose") >= 12
    results = run_quality_benchmark(model_goals=0)
    summary = results["deterministic"]["summary"]
    assert summary["goals"] == len(suite)
    # Whatever the planner: every plan that ran is valid and every failure is a named one.
    assert summary["invalid_plans"] == []
    assert summary["failures_named"] == summary["failures"] > 0
    assert summary["succeeded"] + summary["failures"] == summary["goals"]
    assert "skipped" in results["model"]
    # The goals that need a map over a passage's paragraphs are planned with one.
    assert summary["needing"] == sum(1 for g in suite if g.get("needs")) >= 3
    assert summary["planned_with_it"] == summary["needing"]
    section = "\n".join(quality_section(results))
    assert f"| deterministic | {len(suite)} | {summary['succeeded']} |" in section
    assert f"deterministic: {summary['needing']} of {summary['needing']} planned with it" in section
    assert "Model planners skipped" in section


def test_engine_scale_is_reported() -> None:
    scale = asyncio.run(_scale(EngineBenchConfig(layers=2, width=10, repeats=1), 20, repeats=1))
    assert (scale["small"]["steps"], scale["large"]["steps"]) == (20, 200)
    assert scale["ratio"] > 0
    assert scale["flat"] == (scale["ratio"] <= scale["max_ratio"])


def test_rpc_targets_judge_latency_and_throughput_per_pipeline(tmp_path: Path) -> None:
    # Latency in seconds and calls per wall second, as the load phases collect them: the constant
    # pipeline at 1.2x the echo's latency and 0.5x its throughput, the agent at 2x and 0.7x.
    samples = _Samples()
    latency = {"echo": 1.0, "pipeline_constant": 1.2, "pipeline_agent": 2.0}
    throughput = {"echo": 1000, "pipeline_constant": 500, "pipeline_agent": 700}
    for name in RPC_VARIANTS:
        samples.latency[name] = [latency.get(name, 1.5) * 1e-3] * 3
        samples.loaded[name] = [1e-3] * 3
        samples.calls[name], samples.wall_s[name] = throughput.get(name, 800), 1.0
    cost = summarize([1e-5, 2e-5], scale=1e6)
    audit = {"sqlite_append_us": cost, "thread_hop_us": cost, "memory_append_us": cost}
    sizes = {"request_bytes": 68, "response_bytes": 56}
    rpc = _summarize(RpcBenchConfig(), sizes, samples, audit, {})
    judged = {(t["variant"], t["measure"]): (t["ratio"], t["met"]) for t in rpc["targets"]}
    assert judged == {
        ("pipeline_constant", "latency"): (1.2, True),
        ("pipeline_constant", "throughput"): (0.5, False),
        ("pipeline_agent", "latency"): (2.0, False),
        ("pipeline_agent", "throughput"): (0.7, True),
    }
    shape = EngineBenchConfig(layers=2, width=2, fan_in=1, repeats=1, warmup=0)
    durable = run_durable_benchmark(
        DurableBenchConfig(plan=shape, small_layers=1, large_layers=2), folder=tmp_path
    )
    text = "\n".join(
        _verdict_section(
            verdicts(rpc, {"target": {"max_ratio": 4.0}, "ratios": {}}, durable), rpc, durable
        )
    )
    assert "≥ 0.8x the bare echo's throughput at 32 in flight | 0.50x (500 vs 1,000 req/s)" in text
    assert "≤ 1.6x the bare echo's median latency" in text
    assert "target ≥ 0.6x: **met**" in "\n".join(_rpc_section(rpc))


def test_the_dynamic_sections_measure_and_render() -> None:
    config = DynamicBenchConfig(items=200, repeats=2, warmup=1)
    walls = asyncio.run(_map_walls(config))
    assert set(walls) == {"map", "plain"}
    assert all(len(samples) == 2 for samples in walls.values())
    per_item = {name: summarize(samples, scale=1e6) for name, samples in walls.items()}
    dynamic = {
        "config": asdict(config),
        "per_item_us": per_item,
        "ratio": 0.5,
        "target": {"max_ratio": 1.5, "met": True},
        "peak_rss_mib": {"baseline": 60.0, "plain": 70.0, "map": 61.0, "map_small": 60.5},
        "map_bytes_per_item": 170,
    }
    text = "\n".join(dynamic_section(dynamic))
    assert "A map's item costs 0.50x a plain step; target ≤ 1.5x: **met**" in text
    # The workflow the LangGraph peer also runs: a map, then one branch of two.
    plan = workflow_plan(5)
    assert [step.kind for step in plan.steps] == ["map", "tool", "tool"]
    workflow = {
        "config": {"items": 5, "repeats": 3, "max_parallel": 16},
        "peer": ["langgraph==1.2.24"],
        "variants": {
            name: {"run_ms": summarize([0.001, 0.002], scale=1e3), "per_item_us": 1.0}
            for name in (
                "stratagem_memory",
                "stratagem_sqlite",
                "langgraph_memory",
                "langgraph_sqlite",
            )
        },
        "ratios": {"memory": 0.5, "sqlite": 0.25},
    }
    section = "\n".join(peers_section({"workflow": workflow}))
    assert "### A branch-and-map workflow beside LangGraph" in section
    assert "0.50x without persistence, 0.25x with SQLite" in section


def test_the_model_load_figures_and_section_have_their_shape() -> None:
    from tests.bench.model_load import model_load_section
    from tests.bench.model_proxy import Forwarded, MeasuringProxy

    proxy = MeasuringProxy(upstream_port=1)
    proxy.records = [
        Forwarded("chat", True, queued=0.0, started=0.0, ended=9.0, delivered=True),
        Forwarded("chat", True, queued=0.0, started=9.0, ended=10.0, abandoned=True),
        Forwarded("probe", False, queued=0.0, started=10.0, ended=10.5, delivered=True),
        Forwarded("chat", True, queued=0.0, started=10.5),  # still at the server
    ]
    figures = proxy.figures()
    assert figures["unfinished"] == 1
    assert (figures["model_s"], figures["used_s"], figures["abandoned_s"]) == (10.5, 9.0, 1.0)
    assert figures["used_share"] == round(9.0 / 10.5, 4)
    assert figures["requests"] == {"delivered": 1, "abandoned": 1, "dropped_unsent": 0, "probes": 1}
    result = {
        "model": "m",
        "config": {
            "agents": 4,
            "plans_per_agent": 2,
            "model_timeout_s": 60.0,
            "deadline_s": 300.0,
            "max_tokens": 160,
            "max_repairs": 1,
        },
        "wall_s": 12.0,
        "server": figures,
        "plannings": {
            "tactical": {"outcomes": {"model": 2}, "wall_s": [1.0, 2.0], "model_calls": 2}
        },
        "target": {"min_share": 0.9},
        "met": False,
    }
    lines = model_load_section(result)
    assert lines[0] == "## The model path under load: four agents, one CPU model server"
    assert any("85.7%" in line and "not met" in line for line in lines)
    assert model_load_section({"skipped": "no server"})[-2] == "Skipped: no server."


def test_the_interleaved_comparison_runs_a_tree_in_a_child_of_its_own() -> None:
    from tests.bench.compare import compare

    summary = compare(["."], rounds=1, runs=1, warmup=0)
    figures = summary["."]
    variants = {"engine_noop_tracer", "no_store", "sqlite_side_effecting", "sqlite_idempotent"}
    assert set(figures["per_step_us"]) == variants
    assert all(value > 0 for value in figures["per_step_us"].values())
    assert set(figures["checkpointed_ratio"]) == {"sqlite_side_effecting", "sqlite_idempotent"}
    assert figures["vs_first"] == dict.fromkeys(variants, 1.0)
    assert len(figures["rounds"]) == 1


def test_goal_routing_benchmark_returns_well_formed_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.bench.goal_routing import GOALS, goal_routing_section, run_goal_routing_benchmark
    from tests.unit._registry import registries_kept

    monkeypatch.setattr(sys, "path", list(sys.path))
    cases = (GOALS[0], GOALS[-1])  # one capability, and a goal nothing matches
    with registries_kept():  # the example domain's agents are defined for the run only
        result = run_goal_routing_benchmark(repeats=1, cases=cases, model_goals=0)
    assert result["goals"] == 2
    assert set(result["by_kind"]) == {"1 capability", "unmatched"}
    assert 0.0 <= result["as_meant"] <= 1.0
    assert result["median_ms"] > 0
    section = "\n".join(goal_routing_section(result))
    assert section.startswith("## Goals in plain words")
    assert "| **all (2)** |" in section
    assert result["model"] == {"skipped": "no goal was asked to run with the model"}


def test_the_research_suite_meets_its_precision_target_and_its_section_renders() -> None:
    from tests.bench.research import research_section, run_research_benchmark

    research = run_research_benchmark(model_questions=0)
    assert research["met"], research["precision"]
    assert research["precision"] >= 0.95
    assert 0 < research["recall"] <= 1
    assert len(research["questions"]) == 8
    section = "\n".join(research_section(research))
    assert section.startswith("## Research: citation precision and recall over docs/")
    assert "| How does a plan resume after a crash? |" in section
    assert "Not measured: no question was asked to run with the model." in section


def test_the_research_suite_measures_the_model_path_and_its_section_renders() -> None:
    """The model path of the research benchmark with a scripted model: it writes one extra
    sub-question and a synthesis of two sentences, one its cited passage says and one it does
    not; the kept one is measured against the cited lines, the other counted as refused."""
    import json
    import re

    import yaml

    from stratagem.agents import ChatRequest, ScriptedModelClient
    from stratagem.agents.research import FileScopes, ModelResearcher, expand_sources
    from tests.bench.research import (
        REPO,
        SUITE,
        research_section,
        run_research_model_benchmark,
    )

    def answer(request: ChatRequest) -> str:
        if request.schema_name == "sub_questions":
            return json.dumps({"sub_questions": ["Which steps run again after a restart?"]})
        listed = re.search(r"^- \[([^\]]+)\] (.+)$", request.messages[0].content, re.M)
        assert listed is not None
        return json.dumps(
            {
                "sentences": [
                    {"text": listed.group(2), "cites": [listed.group(1)]},
                    {"text": "The moon is made of green cheese.", "cites": [listed.group(1)]},
                ]
            }
        )

    def researcher() -> ModelResearcher:
        return ModelResearcher(ScriptedModelClient([answer] * 4, model="scripted-270m"))

    suite = yaml.safe_load(SUITE.read_text(encoding="utf-8"))
    files = expand_sources(["docs/"], FileScopes.of([REPO]), base=REPO)
    model = run_research_model_benchmark(suite, files, 1, researcher=researcher)
    assert (model["model"], model["of"], len(model["questions"])) == ("scripted-270m", 8, 1)
    row = model["questions"][0]
    assert row["sub_questions"] == 2
    assert (row["synthesis_sentences"], row["synthesis_refused"]) == (1, 1)
    assert model["synthesis"] == {"sentences": 1, "citations": 1, "precision": 1.0, "refused": 1}
    assert model["precision"] >= 0.95
    section = "\n".join(
        research_section(
            {
                "corpus": {"folder": "docs/", "files": len(files)},
                **{k: model[k] for k in ("questions", "precision", "recall", "citations")},
                "seconds_per_question": model["seconds_per_question"],
                "target_precision": 0.95,
                "met": True,
                "model": model,
            }
        )
    )
    assert "### With the embedded model" in section
    assert "The first 1 of the 8 questions" in section
    assert "1 sentences kept (100.0% of their 1 citations say them); 1 refused" in section
    assert "Refusals: `[s" in section
    assert "does not say: The moon" in section
    assert "| How does a plan resume after a crash? | 2 |" in section


def test_the_memory_benchmark_measures_and_renders() -> None:
    from tests.bench.memory import MemoryBenchConfig, memory_section, run_memory_benchmark

    config = MemoryBenchConfig(items=300, users=3, vocabulary=50, warmup=1, repeats=2)
    memory = run_memory_benchmark(MemoryBenchConfig(**{**asdict(config), "postgres": False}))
    sqlite = memory["stores"]["sqlite"]
    assert set(sqlite["cases_ms"]) == {
        "text_all",
        "text_one",
        "text_filter",
        "newest_filter",
        "get",
        "put",
    }
    assert sqlite["mean_hits_text_all"] > 0
    assert [t["store"] for t in memory["targets"]] == ["sqlite"]
    text = "\n".join(memory_section(memory))
    assert text.startswith("## Memory: recall over 100,000 items")
    assert "two words over all" in text
    assert "postgres: skipped: not asked." in text


def test_the_artifacts_benchmark_gives_its_figures_and_section(tmp_path: Path) -> None:
    from tests.bench.artifacts import (
        ArtifactsBenchConfig,
        artifacts_section,
        run_artifacts_benchmark,
    )

    result = run_artifacts_benchmark(
        ArtifactsBenchConfig(
            file_sizes=(4096,), file_repeats=(1,), step_sizes=(1024, 2048), step_repeats=(1, 1)
        ),
        folder=tmp_path,
    )
    [files] = result["files"]
    assert {"save_ms", "load_ms", "copy_ms", "save_ratio", "load_ratio", "sha256_ms"} <= set(files)
    assert {"save_file_cpu_ms", "load_file_cpu_ms", "copy_cpu_ms", "sha256_cpu_ms"} <= set(files)
    assert [step["bytes"] for step in result["steps"]] == [1024, 2048]
    assert all("cpu_ratio" in step for step in result["steps"])
    assert all(step["kept"] and step["file_ms"] > 0 for step in result["steps"])
    assert len(result["targets"]) == 5
    assert all(isinstance(target["met"], bool) for target in result["targets"])
    text = "\n".join(artifacts_section(result))
    assert text.startswith("## Artifacts")
    assert "a step saving 1024 bytes" in text
    assert "save_file CPU ms" in text
    assert "| blob-file step ms |" in text
    assert list(tmp_path.iterdir()) == []  # everything it wrote is gone
