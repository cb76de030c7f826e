"""``plans show`` and ``watch`` print what happened at a gate and where a fork comes from."""

from __future__ import annotations

import io
import json

from rich.console import Console

from stratagem.planning import Fork, GateStep, Plan, ToolStep
from stratagem.protocol import GateInfo, PlanSnapshot, StepRecord
from stratagem.runtime.operator._history import plan_view
from stratagem.runtime.operator._render import gate_text, plan_forest


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


def test_the_approve_command_of_a_gate_that_asks_carries_a_value() -> None:
    from stratagem.runtime.operator._show import approve_commands

    plan = Plan(
        id="ask",
        owner="strategic",
        goal="g",
        steps=[
            GateStep(id="tension", prompt="How tense?", choices=[0.2, 0.8]),
            GateStep(id="budget", prompt="How much?", input_schema={"type": "integer"}),
            GateStep(id="plain", prompt="Go?"),
        ],
    )
    view = plan_view(
        PlanSnapshot(
            plan_id="ask",
            agent="strategic",
            revision=1,
            status="blocked",
            plan_json=plan.model_dump_json(),
            steps=[
                StepRecord(step_id=step, kind="gate", status="blocked")
                for step in ("tension", "budget", "plain")
            ],
            gates=[
                GateInfo(gate_id="tension", kind="gate", event="opened", choices_json="[0.2,0.8]"),
                GateInfo(
                    gate_id="budget",
                    kind="gate",
                    event="opened",
                    input_schema_json='{"type": "integer"}',
                ),
                GateInfo(gate_id="plain", kind="gate", event="opened"),
            ],
        )
    )
    assert approve_commands(view) == [
        "stratagem approve ask tension --rationale 'why it may go on' --value 0.2",
        "stratagem approve ask budget --rationale 'why it may go on' --value VALUE",
        "stratagem approve ask plain --rationale 'why it may go on'",
    ]
