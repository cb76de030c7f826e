"""The tactical agent's model planner: an action sequence picked from the grounded actions."""

from __future__ import annotations

from typing import Any

from stratagem.agents._actions import actors_for, ground_actions, simulate
from stratagem.agents._model_answer import DeterministicPlanner, ModelAnswer
from stratagem.agents._model_roles._common import action_label, relation_text
from stratagem.agents._tactical import TacticalPlan, TacticalStep, goals_of
from stratagem.planning import Plan, ToolStep
from stratagem.protocol import (
    Action,
    PlanExecutionSequenceRequest,
    WireModel,
)

_SYSTEM = (
    "You plan a story's next actions. Answer with JSON: the list of actions, in order, "
    "that makes every goal fact true, using only the actions offered. Each action needs "
    "its preconditions to hold when it runs. Use as few actions as you can."
)


def _grounded(request: PlanExecutionSequenceRequest) -> dict[str, Action]:
    goals = goals_of(request.beat, request.prior_beats)
    actors = actors_for(request.facts, goals)
    return {action_label(g.action): g.action for g in ground_actions(request.facts, actors)}


def _ask(request: PlanExecutionSequenceRequest) -> str:
    goals = goals_of(request.beat, request.prior_beats)
    return (
        "Facts: "
        + "; ".join(relation_text(f) for f in request.facts)
        + "\nGoals: "
        + "; ".join(relation_text(g) for g in goals)
        + "\nActions offered: "
        + ", ".join(_grounded(request))
    )


def _schema(request: PlanExecutionSequenceRequest) -> dict[str, Any]:
    labels = sorted(_grounded(request))
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["actions"],
        "properties": {
            "actions": {
                "type": "array",
                "minItems": 1,
                "maxItems": request.max_depth,
                "items": {"type": "string", "enum": labels},
            }
        },
    }


def _build(
    answer: Any, request: PlanExecutionSequenceRequest, plan_id: str, planner: DeterministicPlanner
) -> tuple[Plan | None, list[str]]:
    chosen = answer.get("actions") if isinstance(answer, dict) else None
    if not isinstance(chosen, list) or not chosen:
        return None, ['the answer must be {"actions": [...]} with at least one action']
    if len(chosen) > request.max_depth:
        return None, [f"{len(chosen)} actions: more than the {request.max_depth} allowed"]
    grounded = _grounded(request)
    unknown = [str(a) for a in chosen if a not in grounded]
    if unknown:
        return None, [f"not among the actions offered: {', '.join(unknown[:5])}"]
    actions = [grounded[label] for label in chosen]
    goals = goals_of(request.beat, request.prior_beats)
    facts = [f.model_dump() for f in request.facts]
    goal_data = [g.model_dump() for g in goals]
    steps = [
        ToolStep(id="ground", tool="ground_actions", input={"facts": facts, "goals": goal_data}),
        ToolStep(
            id="verify",
            tool="verify_sequence",
            depends_on=["ground"],
            input={
                "facts": facts,
                "actions": [a.model_dump() for a in actions],
                "goals": goal_data,
            },
        ),
    ]
    plan = TacticalPlan(
        id=plan_id,
        owner="tactical",
        goal=f"reach {request.beat.id} with the model's {len(actions)} actions"[:2000],
        steps=steps,
        execution_steps=[
            TacticalStep(step="ground", purpose="ground the actions open to the actors"),
            TacticalStep(step="verify", purpose="re-simulate the model's sequence"),
        ],
        dependencies={step.id: list(step.depends_on) for step in steps},
    )
    return plan, []


async def simulate_judge(plan: Plan, request: WireModel) -> list[str]:
    """The tactical agent's judge: re-simulate the proposed sequence before accepting it."""
    if not isinstance(request, PlanExecutionSequenceRequest):
        return []
    verify = next((s for s in plan.steps if isinstance(s, ToolStep) and s.id == "verify"), None)
    if verify is None:
        return []
    actions = [Action.model_validate(a) for a in verify.input.get("actions", [])]
    goals = goals_of(request.beat, request.prior_beats)
    outcome = simulate(request.facts, actions, goals)
    if outcome.error:
        return [f"the sequence does not run: {outcome.error}"]
    if outcome.unmet:
        return [
            "after the sequence these goals are not reached: "
            + "; ".join(relation_text(g) for g in outcome.unmet)
        ]
    return []


TACTICAL_ANSWER: ModelAnswer[PlanExecutionSequenceRequest] = ModelAnswer(
    request=PlanExecutionSequenceRequest,
    system=_SYSTEM,
    ask=_ask,
    schema=_schema,
    build=_build,
    judge=simulate_judge,
)
"""The tactical agent's answer: a sequence chosen from the grounded actions
(``PlanExecutionSequence``), judged by re-simulating it."""
