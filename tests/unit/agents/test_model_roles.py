"""Role model planners with the scripted model: the tactical agent judges a model's sequence by
simulation, keeps A* as the fallback, and keeps serving while a model thinks."""

from __future__ import annotations

import asyncio
import json

from stratagem.agents import (
    ChatRequest,
    ChatResponse,
    PerceptionAgent,
    ScriptedModelClient,
    TacticalAgent,
    TacticalPlanner,
)
from stratagem.agents._model_planner import ModelPlanningConfig
from stratagem.agents._model_roles import (
    PerceptionModelPlanner,
    TacticalModelPlanner,
    model_planner,
)
from stratagem.planning import InMemoryStateStore
from stratagem.protocol import (
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FindSpatialContextRequest,
    PlanExecutionSequenceRequest,
    PlanExecutionSequenceResponse,
    Relation,
)
from tests.unit.agents.conftest import call
from tests.unit.agents.test_tactical import FACTS, MEANS, THRESHOLD, names

GOOD = ["move(mira,courtyard,garden)", "take(mira,key,garden)"]
REQUEST = PlanExecutionSequenceRequest(beat=MEANS, prior_beats=[], facts=FACTS, max_depth=6)


def _answer(actions: list[str]) -> str:
    return json.dumps({"actions": actions})


def _agent(script: list[object], **config: object) -> tuple[TacticalAgent, ScriptedModelClient]:
    agent = TacticalAgent()
    client = ScriptedModelClient(script, model="tiny")
    agent.use_planner(model_planner(agent, client, ModelPlanningConfig(**config)))  # type: ignore[arg-type]
    return agent, client


async def _sequence(agent: TacticalAgent) -> PlanExecutionSequenceResponse:
    answer = await agent.handle(
        "PlanExecutionSequence", REQUEST, call("PlanExecutionSequence", "tactical")
    )
    assert isinstance(answer, PlanExecutionSequenceResponse)
    return answer


async def test_the_models_sequence_is_offered_only_grounded_actions() -> None:
    agent, client = _agent([_answer(GOOD)])
    assert isinstance(agent.planner, TacticalModelPlanner)
    answer = await _sequence(agent)
    assert names(answer.actions) == GOOD
    assert answer.states_explored == 0  # no search ran
    schema = client.requests[0].schema
    assert schema is not None
    offered = schema["properties"]["actions"]["items"]["enum"]
    assert "take(mira,key,garden)" in offered
    assert schema["properties"]["actions"]["maxItems"] == 6
    (record,) = [r for r in agent.plans("") if r.status == "succeeded"]
    plan = agent.record(record.plan_id).plan
    assert plan.provenance is not None
    assert plan.provenance.author == "model:tiny"


async def test_a_sequence_that_does_not_simulate_is_critiqued_and_repaired() -> None:
    wrong = ["take(mira,key,garden)"]  # mira is not in the garden yet
    agent, client = _agent([_answer(wrong), _answer(GOOD)])
    answer = await _sequence(agent)
    assert names(answer.actions) == GOOD
    critique = client.requests[1].messages[-1].content
    assert critique.startswith("That plan was refused: the sequence does not run:")
    assert "mira" in critique


async def test_every_refused_answer_falls_back_to_the_search() -> None:
    invented = _answer(["fly(mira,garden)"])
    short = _answer(["move(mira,courtyard,garden)"])  # runs, but mira has no key
    agent, _ = _agent([invented, short, short])
    answer = await _sequence(agent)
    assert names(answer.actions) == GOOD
    assert answer.states_explored > 0  # A* found it
    (record,) = list(agent.plans(""))
    plan = agent.record(record.plan_id).plan
    assert plan.provenance is not None
    assert plan.provenance.author == "planner:tactical"
    outcomes = [c.outcome for c in plan.provenance.calls]
    assert outcomes[0] == "not among the actions offered: fly(mira,garden)"
    assert outcomes[1].startswith("after the sequence these goals are not reached: mira has key")


class SlowModel:
    """A model that answers only when released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked = asyncio.Event()

    @property
    def model(self) -> str:
        return "slow"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.asked.set()
        await self.release.wait()
        return ChatResponse(content=_answer(GOOD), model="slow", finish_reason="stop")


async def test_the_agent_keeps_serving_while_a_model_thinks() -> None:
    agent = TacticalAgent()
    slow = SlowModel()
    agent.use_planner(model_planner(agent, slow))
    planning = asyncio.create_task(_sequence(agent))
    await asyncio.wait_for(slow.asked.wait(), 5)
    # Meanwhile the same agent answers Describe and Plans, and runs another plan to the end.
    assert agent.card().role == "tactical"
    assert list(agent.plans("")) == []
    searched = TacticalPlanner().plan(
        "PlanExecutionSequence",
        PlanExecutionSequenceRequest(beat=THRESHOLD, prior_beats=[MEANS], facts=FACTS),
        plan_id="by-hand",
    )
    result = await asyncio.wait_for(agent.submit_plan(searched), 10)
    assert result.status.value == "succeeded"
    assert not planning.done()
    slow.release.set()
    answer = await asyncio.wait_for(planning, 5)
    assert names(answer.actions) == GOOD


LENA = "Lena Park, a tired detective, found the body in the library."


def _reading(entities: list[tuple[str, str]], relations: list[tuple[str, str, str]]) -> str:
    return json.dumps(
        {
            "entities": [{"name": n, "kind": k} for n, k in entities],
            "relations": [{"subject": s, "predicate": p, "object": o} for s, p, o in relations],
        }
    )


async def test_perception_reads_ordinary_prose_with_the_model() -> None:
    agent = PerceptionAgent()
    client = ScriptedModelClient(
        [
            # No character, and a relation about someone not listed: refused with both reasons.
            _reading([("library", "place")], [("Tomas", "at", "library")]),
            _reading(
                [("Lena Park", "character"), ("library", "place"), ("body", "object")],
                [("Lena Park", "at", "library"), ("body", "in", "library")],
            ),
        ],
        model="tiny",
    )
    planner = model_planner(agent, client)
    assert isinstance(planner, PerceptionModelPlanner)
    agent.use_planner(planner)
    answer = await agent.handle(
        "ExtractEntities", ExtractEntitiesRequest(text=LENA), call("ExtractEntities", "perception")
    )
    assert isinstance(answer, ExtractEntitiesResponse)
    assert [(e.id, e.kind) for e in answer.entities] == [
        ("lena_park", "character"),
        ("library", "place"),
        ("body", "object"),
    ]
    assert agent.world.holds(
        Relation.model_validate({"subject": "lena_park", "predicate": "at", "object": "library"})
    )
    critique = client.requests[1].messages[-1].content
    assert "no character was found" in critique
    assert "names tomas, which is not among the entities" in critique
    schema = client.requests[0].schema
    assert schema is not None
    kinds = schema["properties"]["entities"]["items"]["properties"]["kind"]["enum"]
    assert kinds == ["character", "place", "object"]
    # Reading the world back is the rules' work: no model call.
    await agent.handle(
        "FindSpatialContext",
        FindSpatialContextRequest(entity_ids=["lena_park"]),
        call("FindSpatialContext", "perception"),
    )
    assert len(client.requests) == 2


async def test_replay_rederives_a_model_plan_from_its_journal_with_no_model() -> None:
    agent = TacticalAgent(store=InMemoryStateStore())
    client = ScriptedModelClient([_answer(["take(mira,key,garden)"]), _answer(GOOD)], model="tiny")
    planner = model_planner(agent, client)
    assert planner is not None
    agent.use_planner(planner)
    await _sequence(agent)
    (record,) = list(agent.plans(""))
    assert client.remaining == 0  # the script is spent: replay cannot ask it anything
    report = await agent.replay(record.plan_id)
    assert report.divergences == []
    assert report.decisions == 4 * 2 + 1 + 1  # two steps, the plan, the model plan's derivation
    assert len(client.requests) == 2
