"""The plans that decide, run by a real agent: the example plan, and bad input refused first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratagem.agents import StrategicAgent
from stratagem.planning import PlanStatus, SqliteStateStore, StepStatus
from stratagem.protocol import CallContext, InvalidArgumentError, PlansQuery

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plans" / "decide.yaml"


def example() -> dict[str, Any]:
    loaded = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(loaded, dict)
    return loaded


async def test_the_example_plan_decides() -> None:
    result = await StrategicAgent().submit_plan(example())
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.statuses == {
        "protagonist": StepStatus.SUCCEEDED,
        "tension": StepStatus.SUCCEEDED,
        "summary": StepStatus.SUCCEEDED,
        "summary-nobody": StepStatus.SKIPPED,
        "hinted": StepStatus.FAILED,
        "measured": StepStatus.SUCCEEDED,
    }
    assert result.outputs["summary"]["summary"].startswith("A story about mira;")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"when": "tension.tension >"},
            "step 'summary' has an invalid condition: expression 'tension.tension >': the "
            "expression is incomplete",
        ),
        (
            {"when": "measured.summary != ''"},
            "step 'summary' condition references step 'measured' in \"measured.summary != ''\", "
            "which is not among its (transitive) dependencies",
        ),
        (
            {"input": {"protagonist": {"$expr": "ghost.name"}, "themes": [], "tension": 0.5}},
            "step 'summary' references unknown step 'ghost' in 'ghost.name'",
        ),
    ],
)
async def test_bad_expressions_are_refused_before_anything_runs(
    change: dict[str, Any], problem: str
) -> None:
    plan = example()
    plan["steps"][2] = {**plan["steps"][2], **change}
    agent = StrategicAgent()
    ctx = CallContext(caller="operator", target="strategic", capability="RunPlan", request_id="r")
    with pytest.raises(InvalidArgumentError) as info:
        await agent.run_plan(json.dumps(plan), ctx)
    assert problem in str(info.value)
    # Refused before it ran: the agent remembers the refusal, with no step started.
    for snapshot in agent.plans("decide"):
        steps = json.loads(snapshot.plan_json)["steps"]
        assert {step["status"] for step in steps} == {"pending"}


# --- the dynamic forms: one example plan each, run by a real agent -----------------------------


def example_plan(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((EXAMPLE.parent / f"{name}.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


async def test_the_map_example_maps_each_passage_and_branches_on_the_fan_in() -> None:
    result = await StrategicAgent().submit_plan(example_plan("map"))
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert [i["protagonist"] for i in result.outputs["leads"]["items"]] == ["mira", "oren", "mira"]
    assert len(result.outputs["tensions"]["items"]) == 3
    assert (result.statuses["tense"], result.statuses["calm"]) == (
        StepStatus.SUCCEEDED,
        StepStatus.SKIPPED,
    )
    assert result.outputs["tense"]["summary"].startswith("A story about mira;")


async def test_the_loop_example_grows_its_arc_until_it_is_long_enough() -> None:
    agent = StrategicAgent()
    result = await agent.submit_plan(example_plan("loop"))
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    grown = result.outputs["grow"]
    assert (grown["iterations"], grown["done"]) == (2, True)
    assert len(grown["last"]["check"]["beats"]) == 3
    # Each iteration is a plan of its own, shown with its parent.
    shown = {snapshot.plan_id: snapshot.status for snapshot in agent.plans("grow-arc")}
    assert shown == {
        "grow-arc": "succeeded",
        "grow-arc/grow.1": "succeeded",
        "grow-arc/grow.2": "succeeded",
    }


async def test_the_subplan_example_runs_its_analysis_as_a_nested_plan() -> None:
    agent = StrategicAgent()
    result = await agent.submit_plan(example_plan("subplan"))
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert set(result.outputs["analysis"]) == {"who", "themes", "tension"}
    assert result.outputs["summary"]["summary"].startswith("A story about mira; themes: courage")
    events = [e async for e in agent.watch("subplan/analysis")]
    assert [(e.step_id, e.status) for e in events if not e.step_id] == [
        ("", "running"),
        ("", "succeeded"),
    ]


async def test_the_priorities_example_starts_the_needed_steps_first() -> None:
    agent = StrategicAgent()
    result = await agent.submit_plan(example_plan("priorities"))
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    events = [e async for e in agent.watch("priorities")]
    started = [e.step_id for e in events if e.status == "running" and e.step_id]
    assert started == ["who", "tension", "summary", "themes"]


@pytest.mark.parametrize(
    ("name", "change", "problem"),
    [
        (
            "map",
            {"over": "length(inputs.passages)"},
            "step 'leads' maps over a number, not a list ('over': 'length(inputs.passages)')",
        ),
        ("map", {"max_items": 2}, "step 'leads' maps over 3 items, more than its max_items 2"),
        (
            "map",
            {"over": "inputs.passages[0]"},
            "step 'leads' maps over a string, not a list ('over': 'inputs.passages[0]')",
        ),
        (
            "loop",
            {"max_iterations": None},
            "step 'grow' is a loop without a bound: give max_iterations, timebox_s or both",
        ),
        (
            "loop",
            {"until": "length(check.beats) >="},
            "step 'grow' has an invalid condition ('until'): expression 'length(check.beats) "
            ">=': the expression is incomplete",
        ),
        (
            "subplan",
            {"steps": [{"kind": "tool", "id": "x", "tool": "apply_actions", "input": {}}]},
            "step 'analysis' body: step 'x' uses tool 'apply_actions', which is not in the "
            "strategic agent's registry",
        ),
    ],
)
async def test_bad_dynamic_steps_are_refused_in_one_line_before_anything_runs(
    name: str, change: dict[str, Any], problem: str
) -> None:
    plan = example_plan(name)
    step = next(s for s in plan["steps"] if s["kind"] in ("map", "loop", "subplan"))
    step.update(change)
    agent = StrategicAgent()
    ctx = CallContext(caller="operator", target="strategic", capability="RunPlan", request_id="r")
    with pytest.raises(InvalidArgumentError) as info:
        await agent.run_plan(json.dumps(plan), ctx)
    message = str(info.value)
    assert "\n" not in message
    assert problem in message
    assert not [s for s in agent.plans(plan["id"]) if s.plan_id != plan["id"]]  # nothing nested


async def test_the_example_shows_each_steps_input_as_its_tool_received_it(tmp_path: Path) -> None:
    """``plans show`` reads these records: ``protagonist`` showed ``"text": null`` and
    ``hinted`` ``"tension": null`` (issue 32)."""
    plan = example()
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = StrategicAgent(store=store)
        await agent.submit_plan(plan)
        page = await agent.history(PlansQuery(plan_id=plan["id"], view="steps"), 1 << 20)
    shown = {step.step_id: json.loads(step.input_json) for step in page.plans[0].steps}
    assert shown["protagonist"] == {"text": plan["inputs"]["text"], "entities": []}
    assert shown["hinted"]["tension"] == "high"
