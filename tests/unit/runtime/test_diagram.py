"""Pictures of a plan and the sub-plans it caused (``plans show --format``)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from stratagem.protocol import PlanSnapshot
from stratagem.runtime._cli import app
from stratagem.runtime.operator._diagram import plan_diagram
from stratagem.runtime.operator._history import plan_view


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


# --- branches, maps, loops and sub-plans -------------------------------------------------------

DECIDING = PlanSnapshot(
    plan_id="d",
    agent="strategic",
    revision=1,
    status="succeeded",
    plan_json=_plan(
        "d",
        "strategic",
        [
            {"kind": "tool", "id": "search", "tool": "find", "status": "failed"},
            {
                "kind": "tool",
                "id": "read",
                "tool": "read",
                "depends_on": ["search"],
                "when": "length(search.hits) > `0`",
                "status": "skipped",
            },
            {
                "kind": "gate",
                "id": "ask",
                "prompt": "?",
                "depends_on": ["search"],
                "runs_on": "failure",
                "status": "succeeded",
            },
            {
                "kind": "map",
                "id": "each",
                "over": "inputs.passages",
                "max_items": 50,
                "max_parallel": 3,
                "tool": "measure",
                "priority": 2,
                "status": "succeeded",
            },
            {
                "kind": "loop",
                "id": "grow",
                "max_iterations": 4,
                "until": "check.ok",
                "depends_on": ["each"],
                "status": "succeeded",
                "steps": [
                    {"kind": "tool", "id": "draft", "tool": "draft"},
                    {"kind": "tool", "id": "check", "tool": "check", "depends_on": ["draft"]},
                ],
            },
            {
                "kind": "subplan",
                "id": "sub",
                "status": "succeeded",
                "steps": [{"kind": "tool", "id": "inner", "tool": "x"}],
            },
        ],
    ),
)
ITERATION = PlanSnapshot(
    plan_id="d/grow.2",
    agent="strategic",
    revision=1,
    status="succeeded",
    plan_json=_plan("d/grow.2", "strategic", [{"kind": "tool", "id": "draft", "tool": "draft"}]),
)
NESTED = PlanSnapshot(
    plan_id="d/sub",
    agent="strategic",
    revision=1,
    status="succeeded",
    plan_json=_plan("d/sub", "strategic", [{"kind": "tool", "id": "inner", "tool": "x"}]),
)


def test_mermaid_draws_conditions_routes_maps_loops_and_sub_plans() -> None:
    text = plan_diagram([plan_view(s) for s in (DECIDING, ITERATION, NESTED)], "d", "mermaid")
    lines = text.splitlines()
    # A condition labels the edge into its step; a route on failure is dotted and says so.
    assert '  p0s0 -->|"when length(search.hits) #gt; `0`"| p0s1' in lines
    assert '  p0s0 -.->|"on failure"| p0s2' in lines
    # A map is a node of its own shape, with its list, bounds, work and priority.
    assert (
        '    p0s3[["each · map over inputs.passages (at most 50, 3 at once) · tool measure · '
        'priority 2 (succeeded)"]]:::succeeded'
    ) in lines
    # A loop repeats (an edge back to itself) and its body is a cluster beside it.
    assert '    p0s4{{"grow · loop (at most 4) (succeeded)"}}:::succeeded' in lines
    assert '  p0s4 -->|"repeat until check.ok"| p0s4' in lines
    assert '    subgraph p0s4b["body of grow (one plan per iteration)"]' in lines
    assert "  p0s4bs0 --> p0s4bs1" in lines
    # Each nested plan it ran points back at it; so does a sub-plan's.
    cluster = {
        snap: line.split()[1].split("[")[0]
        for snap in ("d/grow.2", "d/sub")
        for line in lines
        if line.strip().startswith("subgraph p") and snap in line
    }
    assert f"  p0s4 -.-> {cluster['d/grow.2']}" in lines
    assert f"  p0s5 -.-> {cluster['d/sub']}" in lines


def test_dot_draws_conditions_routes_maps_and_loops() -> None:
    text = plan_diagram([plan_view(s) for s in (DECIDING, ITERATION)], "d", "dot")
    assert 'p0s0 -> p0s1 [label="when length(search.hits) > `0`"];' in text
    assert 'p0s0 -> p0s2 [label="on failure", style=dotted, color="#c62828"];' in text
    assert "shape=box3d" in text  # the map
    assert 'p0s4 -> p0s4 [label="repeat until check.ok"];' in text
    assert "subgraph cluster_p0s4b {" in text
    assert "p0s4 -> p0s4bs0 [style=dashed, lhead=cluster_p0s4b];" in text
    assert text.count("{") == text.count("}")
