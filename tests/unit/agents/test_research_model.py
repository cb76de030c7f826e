"""A model in the research path (docs/research.md): a scripted model writes the sub-questions and
a synthesis; the synthesis is checked against the cited passages and refused sentences critiqued."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from stratagem.agents import ScriptedModelClient, ToolRegistry
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    ModelResearcher,
    Report,
    check_report,
    expand_sources,
    research_plan,
    research_tools,
)
from stratagem.planning import Engine

RESUME = """# Resuming

A plan that stopped in a crash is resumed from its journal.

Resume skips completed steps and re-runs an in-flight step only when it is idempotent.
"""


def _run(tmp_path: Path, model: ScriptedModelClient, question: str) -> tuple[Report, object]:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.md").write_text(RESUME)
    scopes = FileScopes.of([root])
    cache = InMemorySourceCache()
    registry = ToolRegistry("perception")
    tools = research_tools(cache, FetchLedger(None), scopes, model=ModelResearcher(model))
    for item in tools:
        registry.register(item)
    plan = research_plan(question, expand_sources([str(root)], scopes, base=root), plan_id="m-1")
    result = asyncio.run(Engine(tools=registry, agent="perception").run(plan))
    assert result.status == "succeeded", result.failures
    report = Report.model_validate(result.outputs["report"])
    check_report(report.markdown, report.sources, cache)
    return report, cache


def test_the_model_writes_sub_questions_and_a_synthesis_whose_wrong_sentence_is_refused(
    tmp_path: Path,
) -> None:
    good = {"text": "A crashed plan resumes from its journal.", "cites": ["s1:L3-3"]}
    wrong = {"text": "A crashed plan restarts every step from the beginning.", "cites": ["s1:L3-3"]}
    model = ScriptedModelClient(
        [
            json.dumps({"sub_questions": ["Where does a resumed plan start from?"]}),
            json.dumps({"sentences": [good, wrong]}),
            json.dumps({"sentences": [good, wrong]}),  # the critique changed nothing
        ]
    )
    report, _ = _run(tmp_path, model, "How does a plan resume after a crash?")
    assert [q.text for q in report.sub_questions] == [
        "How does a plan resume after a crash?",
        "Where does a resumed plan start from?",
    ]
    assert "## Synthesis" in report.markdown
    assert "- A crashed plan resumes from its journal. [s1:L3-3]" in report.markdown
    assert "restarts every step" not in report.markdown
    assert report.refused == [
        "[s1:L3-3] does not say: A crashed plan restarts every step from the beginning."
    ]
    critique = model.requests[2].messages[-1].content
    assert "These sentences were refused: [s1:L3-3] does not say" in critique
    assert len(model.requests) == 3  # sub-questions, a synthesis, one more after the critique


def test_a_model_answer_that_is_not_json_falls_back_to_the_deterministic_path(
    tmp_path: Path,
) -> None:
    model = ScriptedModelClient(["not json", "still not json"])
    report, _ = _run(tmp_path, model, "How does a plan resume after a crash?")
    assert [q.text for q in report.sub_questions] == ["How does a plan resume after a crash?"]
    assert "## Synthesis" not in report.markdown
    assert report.refused == ["the answer was not a synthesis (LogicError)"]
    assert report.claims


def test_the_steps_a_model_writes_get_the_models_limit_and_only_with_a_model() -> None:
    from stratagem.agents.research import research_plan

    timed = research_plan("Why?", ["a.md", "b.md"], plan_id="r-1", model_timeout_s=360.0)
    limits = {step.id: step.timeout_s for step in timed.steps}
    assert limits["scope"] == limits["report"] == 360.0
    assert {limits[s] for s in limits if s not in ("scope", "report")} == {None}
    plain = research_plan("Why?", ["a.md"], plan_id="r-2")
    assert {step.timeout_s for step in plain.steps} == {None}
