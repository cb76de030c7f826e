"""Pictures of a plan and the sub-plans it caused (``plans show --format``)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from stratagem.protocol import PlanSnapshot
from stratagem.runtime._cli import app
from stratagem.runtime._diagram import plan_diagram
from stratagem.runtime._history import plan_view


def _plan(plan_id: str, owner: str, steps: list[dict[str, object]]) -> str:
    return json.dumps({"id": plan_id, "owner": owner, "goal": "g", "steps": steps})


ROOT = PlanSnapshot(
    plan_id="goal-1",
    agent="orchestrator",
    revision=1,
    status="succeeded",
    plan_json=_plan(
        "goal-1",
        "orchestrator",
        [
            {
                "kind": "cross_agent",
                "id": "extract",
                "target": "perception",
                "capability": "ExtractEntities",
                "depends_on": [],
                "status": "succeeded",
            },
            {
                "kind": "cross_agent",
                "id": 'odd "id"',
                "target": "strategic",
                "capability": "AnalyzeNarrative",
                "depends_on": ["extract"],
                "status": "failed",
            },
        ],
    ),
)
CHILD = PlanSnapshot(
    plan_id="goal-1/extract",
    agent="perception",
    revision=1,
    status="succeeded",
    plan_json=_plan(
        "goal-1/extract",
        "perception",
        [{"kind": "tool", "id": "s1", "tool": "extract", "depends_on": [], "status": "succeeded"}],
    ),
)
# Another goal whose id starts with the same characters: not part of the picture.
OTHER = PlanSnapshot(
    plan_id="goal-12",
    agent="orchestrator",
    revision=1,
    status="running",
    plan_json=_plan("goal-12", "orchestrator", [{"kind": "gate", "id": "g", "depends_on": []}]),
)


def test_mermaid_has_a_cluster_per_plan_edges_and_status_classes() -> None:
    text = plan_diagram([plan_view(s) for s in (ROOT, CHILD, OTHER)], "goal-1", "mermaid")
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert sum(line.strip().startswith("subgraph ") for line in lines) == 2
    assert "goal-12" not in text
    # The dependency, and the cross-agent step pointing at the plan it caused.
    assert "  p0s0 --> p0s1" in lines
    assert "  p0s0 -.-> p1" in lines
    assert any(line.startswith("  classDef failed fill:") for line in lines)
    assert re.search(
        r'p0s1\["odd #quot;id#quot; · strategic.AnalyzeNarrative \(failed\)"\]:::failed', text
    )
    # Node names are the renderer's own: nothing of a plan's ids outside labels.
    for line in lines:
        if line.strip().startswith("p") and "[" in line:
            assert re.fullmatch(r"p\d+s\d+", line.strip().split("[", 1)[0])


def test_dot_is_a_digraph_with_clusters_and_escaped_labels() -> None:
    text = plan_diagram([plan_view(s) for s in (ROOT, CHILD)], "goal-1", "dot")
    assert text.startswith("digraph plan {")
    assert text.rstrip().endswith("}")
    assert text.count("subgraph cluster_") == 2
    assert "p0s0 -> p0s1;" in text
    assert "p0s0 -> p1s0 [style=dashed, lhead=cluster_p1];" in text
    assert 'odd \\"id\\"' in text
    assert text.count("{") == text.count("}")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["plans", "show", "goal-1", "--format", "png"],
            "unknown format 'png'; valid: dot, mermaid",
        ),
        (["plans", "list", "--status", "done"], "unknown status 'done'; valid: blocked,"),
        (
            ["plans", "list", "--agent", "narrator"],
            "unknown agent 'narrator'; valid: orchestrator,",
        ),
        (["describe", "narrator"], "unknown agent 'narrator'; valid: orchestrator, perception,"),
    ],
)
def test_unknown_names_are_answered_with_the_valid_ones(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert fragment in " ".join(result.output.split())


def test_an_unknown_command_is_refused_with_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["describ"])
    assert result.exit_code == 2
    assert "No such command" in result.output
