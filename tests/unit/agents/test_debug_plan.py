"""The debug template plan (examples/plans/debug.yaml) over its broken fixture, with the
hypothesis tools on an in-memory memory (docs/research.md, "Hypotheses")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from stratagem.agents import InMemoryMemoryStore, PerceptionAgent, ToolRegistry
from stratagem.agents._perception import PerceptionPlan
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    Investigations,
    hypothesis_tools,
    research_tools,
)
from stratagem.planning import Engine, ToolContext, validate_plan

REPO = Path(__file__).resolve().parents[3]
PLAN = REPO / "examples" / "plans" / "debug.yaml"


def _registry(store: InMemoryMemoryStore, cache: InMemorySourceCache) -> ToolRegistry:
    registry = PerceptionAgent().registry
    for item in [
        *research_tools(cache, FetchLedger(None), FileScopes.of([REPO])),
        *hypothesis_tools(store, cache),
    ]:
        registry.register(item, replace=True)
    return registry


def test_the_debug_plan_finds_the_root_cause_and_writes_the_postmortem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)  # the plan names its fixture from the repository, as a user runs it
    store, cache = InMemoryMemoryStore(), InMemorySourceCache()
    registry = _registry(store, cache)
    plan = PerceptionPlan.model_validate(yaml.safe_load(PLAN.read_text(encoding="utf-8")))
    validate_plan(plan, tools=registry.names())

    result = asyncio.run(Engine(tools=registry, agent="perception").run(plan))
    assert result.status == "succeeded", result.failures
    assert result.outputs["reproduce"]["reason"] == "a binary file (it holds NUL bytes), not text"
    statuses = result.statuses
    assert (statuses["fix_text"], statuses["fix_scope"], statuses["escalate"]) == (
        "succeeded",
        "skipped",
        "skipped",
    )
    found = asyncio.run(Investigations(store).get("debug-unreadable-note"))
    assert found is not None
    ranked = {s.hypothesis.id: s.confidence for s in found.tracker.ranked()}
    assert ranked["H1"] == pytest.approx(0.9)
    assert ranked["H2"] == pytest.approx(0.3 / 0.7 / 9 / (1 + 0.3 / 0.7 / 9), abs=1e-6)
    assert found.tracker.ranked()[0].hypothesis.id == "H1"
    assert found.root_cause.startswith("H1")
    postmortem = cache.get(found.postmortem).decode()
    for section in ("## Context", "## Reproduction", "## Hypotheses", "## Evidence",
                    "## Decision table", "## Root cause", "## Fix"):  # fmt: skip
        assert section in postmortem
    assert result.outputs["fix_text"]["digest"] == found.postmortem


def test_a_test_step_run_again_adds_no_second_evidence() -> None:
    store, cache = InMemoryMemoryStore(), InMemorySourceCache()
    registry = _registry(store, cache)
    ctx = ToolContext(plan_id="p", step_id="t1", attempt=1, agent="perception")

    async def go() -> None:
        await registry.run_tool(
            "hypotheses.open",
            {"investigation": "inv", "context": {"symptom": "it fails"}},
            ctx,
        )
        await registry.run_tool(
            "hypotheses.add",
            {
                "investigation": "inv",
                "hypotheses": [
                    {"id": "H1", "statement": "s", "rationale": "r", "prior": 0.5, "test_cost": 1}
                ],
                "decisions": [],
            },
            ctx,
        )
        test = {"investigation": "inv", "hypothesis": "H1", "observed": True, "note": "seen"}
        first = await registry.run_tool("hypotheses.test", test, ctx)
        again = await registry.run_tool("hypotheses.test", test, ctx)
        assert first == again == {"hypothesis": "H1", "confidence": 0.75, "holds": True}

    asyncio.run(go())
    found = asyncio.run(Investigations(store).get("inv"))
    assert found is not None
    assert len(found.tracker.evidence) == 1


def test_evidence_for_an_unknown_hypothesis_fails_the_step_naming_it() -> None:
    from stratagem.planning import LogicError

    store, cache = InMemoryMemoryStore(), InMemorySourceCache()
    registry = _registry(store, cache)
    ctx = ToolContext(plan_id="p", step_id="t1", attempt=1, agent="perception")

    async def go() -> None:
        await registry.run_tool(
            "hypotheses.open", {"investigation": "inv", "context": {"symptom": "x"}}, ctx
        )
        with pytest.raises(LogicError, match="no hypothesis H7"):
            await registry.run_tool(
                "hypotheses.test",
                {"investigation": "inv", "hypothesis": "H7", "observed": True, "note": "n"},
                ctx,
            )
        with pytest.raises(LogicError, match="no investigation 'nope'"):
            await registry.run_tool(
                "hypotheses.test",
                {"investigation": "nope", "hypothesis": "H1", "observed": True, "note": "n"},
                ctx,
            )

    asyncio.run(go())
