"""The strategic agent's model planner: the beats of an arc for any goal."""

from __future__ import annotations

from typing import Any

from stratagem.agents._model_answer import DeterministicPlanner, ModelAnswer
from stratagem.agents._model_roles._common import PREDICATES, one_line_error, relation_text
from stratagem.agents._strategic import (
    DramaticBeat,
    NarrativeGoal,
    StrategicPlan,
    arc_problems,
)
from stratagem.planning import Plan, ToolStep
from stratagem.protocol import (
    Beat,
    PlanNarrativeArcRequest,
    Relation,
    WireModel,
)

_SYSTEM = (
    "You plan the dramatic arc of a story goal as beats. Each beat has a short title and "
    "one to three goal facts that hold once it is reached; goals accumulate (a later beat "
    "keeps every earlier goal, so never place someone or something in two places), each "
    "beat adds a goal that is not already true, and the last beat reaches the goal. Use "
    "only the entities and predicates offered."
)


def _ask(request: PlanNarrativeArcRequest) -> str:
    return (
        f"Goal: {request.goal}\nProtagonist: {request.protagonist or 'none named'}\n"
        f"Facts: {'; '.join(relation_text(f) for f in request.facts)}\nBeats: {request.beats}"
    )


def _schema(request: PlanNarrativeArcRequest) -> dict[str, Any]:
    entities = sorted(_entities_of(request.facts, request.protagonist)) or ["none"]
    slug = {"type": "string", "enum": entities}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["beats"],
        "properties": {
            "beats": {
                "type": "array",
                "minItems": request.beats,
                "maxItems": request.beats,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["title", "goals"],
                    "properties": {
                        "title": {"type": "string", "minLength": 1, "maxLength": 60},
                        "goals": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 3,
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["subject", "predicate", "object"],
                                "properties": {
                                    "subject": slug,
                                    "predicate": {"type": "string", "enum": PREDICATES},
                                    "object": slug,
                                },
                            },
                        },
                    },
                },
            }
        },
    }


def _build(
    answer: Any, request: PlanNarrativeArcRequest, plan_id: str, planner: DeterministicPlanner
) -> tuple[Plan | None, list[str]]:
    raw = answer.get("beats") if isinstance(answer, dict) else None
    if not isinstance(raw, list) or len(raw) != request.beats:
        return None, [f'the answer must be {{"beats": [...]}} with exactly {request.beats}']
    beats: list[Beat] = []
    problems: list[str] = []
    for index, item in enumerate(raw, start=1):
        try:
            beats.append(
                Beat.model_validate(
                    {
                        "id": f"beat_{index}",
                        "title": str(item.get("title", ""))[:60] or f"Beat {index}",
                        "goals": item.get("goals"),
                    }
                    if isinstance(item, dict)
                    else item
                )
            )
        except ValueError as exc:
            problems.append(f"beat {index}: {one_line_error(exc)}")
    if problems:
        return None, problems[:8]
    plan = StrategicPlan(
        id=plan_id,
        owner="strategic",
        goal=f"check a proposed {request.beats}-beat arc: {request.goal}"[:2000],
        narrative_goals=[NarrativeGoal(text=request.goal, protagonist=request.protagonist)],
        thematic_elements=list(request.themes),
        dramatic_beats=[DramaticBeat(id=b.id, index=i) for i, b in enumerate(beats, 1)],
        steps=[
            ToolStep(
                id="decompose",
                tool="check_arc",
                input={
                    "beats": [b.model_dump() for b in beats],
                    "facts": [f.model_dump() for f in request.facts],
                    "protagonist": request.protagonist,
                    "goal": request.goal,
                },
            )
        ],
    )
    return plan, []


def _entities_of(facts: list[Relation], protagonist: str) -> set[str]:
    found = {f.subject for f in facts} | {f.object for f in facts}
    return found | ({protagonist} if protagonist else set())


async def arc_judge(plan: Plan, request: WireModel) -> list[str]:
    """The strategic agent's judge: ``arc_problems`` on the proposed beats, before they run."""
    if not isinstance(request, PlanNarrativeArcRequest):
        return []
    step = next((s for s in plan.steps if isinstance(s, ToolStep) and s.tool == "check_arc"), None)
    if step is None:
        return []
    beats = [Beat.model_validate(b) for b in step.input.get("beats", [])]
    return arc_problems(beats, list(request.facts), request.protagonist, request.goal)


STRATEGIC_ANSWER: ModelAnswer[PlanNarrativeArcRequest] = ModelAnswer(
    request=PlanNarrativeArcRequest,
    system=_SYSTEM,
    ask=_ask,
    schema=_schema,
    build=_build,
    judge=arc_judge,
)
"""The strategic agent's answer: the beats of an arc for any goal (``PlanNarrativeArc``),
judged by ``arc_problems``; ``AnalyzeNarrative`` stays with the rules."""
