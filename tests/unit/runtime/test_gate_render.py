"""``plans show`` and ``watch`` print what happened at a gate and where a fork comes from."""

from __future__ import annotations

import io
import json

from rich.console import Console

from stratagem.planning import Fork, GateStep, Plan, ToolStep
from stratagem.protocol import GateInfo, PlanSnapshot
from stratagem.runtime._history import plan_view
from stratagem.runtime._render import gate_text, plan_forest


def _printed(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_a_plans_gates_and_lineage_are_shown() -> None:
    plan = Plan(
        id="child",
        owner="tactical",
        goal="g",
        steps=[
            GateStep(id="ok", prompt="Ship?"),
            ToolStep(id="pay", tool="charge", depends_on=["ok"]),
        ],
        forked_from=Fork(plan_id="parent", revision=2, at_step="pay", carried=["ok"], author="ana"),
    )
    snapshot = PlanSnapshot(
        plan_id="child",
        agent="tactical",
        revision=1,
        status="blocked",
        plan_json=plan.model_dump_json(),
        gates=[
            GateInfo(
                gate_id="ok",
                event="decided",
                decision="approved",
                approver="bo",
                value_json=json.dumps({"count": 2}),
            ),
            GateInfo(
                gate_id="pay",
                kind="tool",
                event="escalated",
                tool="charge",
                arguments_json='{"amount":5}',
                deciders=["role:leads"],
            ),
        ],
    )
    text = _printed(plan_forest([plan_view(snapshot)], "child"))
    assert "forked from plan parent revision 2 at step pay (carried ok) by ana" in text
    assert 'gate decided; approved by bo with {"count": 2}' in text
    assert 'tool gate escalated; tool charge with {"amount":5}; for role:leads' in text


def test_an_open_gate_says_what_it_asks() -> None:
    gate = GateInfo(gate_id="pick", choices_json='["a","b"]', deciders=["ana"])
    assert str(gate_text(gate)) == 'gate opened; choices ["a","b"]; for ana'
