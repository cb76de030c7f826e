"""Dynamic steps that cannot run are refused by ``plans run`` before anything starts: one line
naming the step and the problem, exit code 2 (no agent is asked: the CLI checks the plan as its
owner will)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from stratagem.runtime._cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plans"


@pytest.mark.parametrize(
    ("example", "change", "problem"),
    [
        (
            "loop",
            {"max_iterations": None},
            "step 'grow' is a loop without a bound: give max_iterations, timebox_s or both",
        ),
        (
            "map",
            {"over": "length(inputs.passages)"},
            "step 'leads' maps over a number, not a list ('over': 'length(inputs.passages)')",
        ),
        ("map", {"max_items": 1}, "step 'leads' maps over 3 items, more than its max_items 1"),
        (
            "map",
            {"over": "inputs.passages["},
            "step 'leads' has an invalid list ('over'): expression 'inputs.passages[': the "
            "expression is incomplete",
        ),
    ],
)
def test_a_plan_that_cannot_run_is_one_line_and_exit_2(
    example: str, change: dict[str, Any], problem: str, tmp_path: Path, monkeypatch: Any
) -> None:
    plan = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    step = next(s for s in plan["steps"] if s["kind"] in ("map", "loop"))
    step.update(change)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["plans", "run", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert problem in lines[0]
