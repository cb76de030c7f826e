"""The plans that decide, run by a real agent: the example plan, and bad input refused first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratagem.agents import StrategicAgent
from stratagem.planning import PlanStatus, StepStatus
from stratagem.protocol import CallContext, FailedPreconditionError

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
    with pytest.raises(FailedPreconditionError) as info:
        await agent.run_plan(json.dumps(plan), ctx)
    assert problem in str(info.value)
    # Refused before it ran: the agent remembers the refusal, with no step started.
    for snapshot in agent.plans("decide"):
        steps = json.loads(snapshot.plan_json)["steps"]
        assert {step["status"] for step in steps} == {"pending"}
