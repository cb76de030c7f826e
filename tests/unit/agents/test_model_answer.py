"""A role's model answer is data: a new one is one ``ModelAnswer`` value that the one
``ModelPlanner`` composes, with no subclass, no hook and no ``super()``."""

from __future__ import annotations

import json
from typing import Any

from stratagem.agents import Agent, ModelPlanner, ScriptedModelClient, StrategicAgent
from stratagem.agents._model_answer import DeterministicPlanner, ModelAnswer
from stratagem.planning import Plan
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    PlanNarrativeArcRequest,
    WireModel,
)
from tests.unit.agents.conftest import call

TEXT = "Mira waits in the courtyard."


def _build(
    answer: Any, request: AnalyzeNarrativeRequest, plan_id: str, planner: DeterministicPlanner
) -> tuple[Plan | None, list[str]]:
    if not isinstance(answer, dict) or answer.get("analyse") is not True:
        return None, ['the answer must be {"analyse": true}']
    return planner.plan("AnalyzeNarrative", request, plan_id=plan_id), []


async def _judge(plan: Plan, request: WireModel) -> list[str]:
    judged.append(plan.id)
    return []


judged: list[str] = []

TOY: ModelAnswer[AnalyzeNarrativeRequest] = ModelAnswer(
    request=AnalyzeNarrativeRequest,
    system="You decide whether to analyse a passage.",
    ask=lambda request: f"Passage: {request.text}",
    schema=lambda request: {"type": "object", "required": ["analyse"]},
    build=_build,
    judge=_judge,
)


def _agent(script: list[object]) -> tuple[Agent, ScriptedModelClient]:
    agent = StrategicAgent()
    client = ScriptedModelClient(script, model="tiny")
    agent.use_planner(
        ModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=agent.planner,  # type: ignore[arg-type]
            answer=TOY,
        )
    )
    return agent, client


async def test_a_toy_answer_is_asked_built_and_judged_as_it_says() -> None:
    judged.clear()
    agent, client = _agent(["[]", json.dumps({"analyse": True})])
    answer = await agent.handle(
        "AnalyzeNarrative",
        AnalyzeNarrativeRequest(text=TEXT),
        call("AnalyzeNarrative", "strategic", plan_id="toy"),
    )
    assert isinstance(answer, AnalyzeNarrativeResponse)
    first, second = client.requests
    assert [m.content for m in first.messages] == [TOY.system, f"Passage: {TEXT}"]
    assert first.schema == {"type": "object", "required": ["analyse"]}
    # The refused answer came back as the critique of the second call.
    assert 'the answer must be {"analyse": true}' in second.messages[-1].content
    assert judged == ["toy"]
    assert isinstance(agent.planner, TOY)  # the answer names the planner composing it
    record = agent.record("toy")
    assert record.plan.provenance is not None
    assert record.plan.provenance.author == "model:tiny"


async def test_a_request_the_answer_does_not_cover_goes_to_the_roles_own_planner() -> None:
    agent, client = _agent([])
    request = PlanNarrativeArcRequest(goal="Mira recovers the crown", protagonist="mira")
    planner = agent.planner
    assert isinstance(planner, ModelPlanner)
    plan = await planner.plan("PlanNarrativeArc", request, plan_id="arc")
    assert client.requests == []  # the model was not asked
    assert plan.provenance is None  # the strategic planner's own plan, as it makes it
    assert plan == StrategicAgent.spec.planner().plan("PlanNarrativeArc", request, plan_id="arc")
