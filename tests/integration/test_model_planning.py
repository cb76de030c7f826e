"""Model planning against the real embedded model server (llama.cpp, Gemma 3 270M): every
accepted plan is valid whatever the model says, every call is journaled, and the journal re-derives
the plan with no model at all. Few, small calls: the benchmark is where the goal suite runs."""

from __future__ import annotations

import pytest

from stratagem.agents import (
    ModelConfig,
    ModelPlanningConfig,
    OpenAIModelClient,
    OrchestratorModelPlanner,
    PerceptionAgent,
    StrategicAgent,
    StrategicModelPlanner,
    TacticalAgent,
    model_planner,
    rederive,
)
from stratagem.agents._actions import simulate
from stratagem.agents._roles import build_in_memory
from stratagem.agents._strategic import arc_problems
from stratagem.planning import TransientError
from stratagem.protocol import (
    FailedPreconditionError,
    PlanExecutionSequenceRequest,
    PlanExecutionSequenceResponse,
    PlanNarrativeArcRequest,
    PlanNarrativeArcResponse,
    SubmitGoalRequest,
    SubmitGoalResponse,
)
from tests.unit.agents.conftest import call
from tests.unit.agents.test_tactical import FACTS, MEANS

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(2400)]

REQUEST = PlanExecutionSequenceRequest(beat=MEANS, prior_beats=[], facts=FACTS, max_depth=4)


def _client(server: dict[str, str], **config: object) -> OpenAIModelClient:
    return OpenAIModelClient(
        ModelConfig(
            url=server["url"],
            model=server["model"],
            schema_style="json_object",
            timeout_s=120,
            max_concurrent=1,
            **config,  # type: ignore[arg-type]
        )
    )


async def test_the_tactical_model_plans_against_the_real_server_and_replays_without_it(
    model_server: dict[str, str],
) -> None:
    agent = TacticalAgent()
    planner = model_planner(
        agent, _client(model_server), ModelPlanningConfig(max_repairs=1, max_tokens=96)
    )
    assert planner is not None
    agent.use_planner(planner)
    answer = await agent.handle(
        "PlanExecutionSequence", REQUEST, call("PlanExecutionSequence", "tactical")
    )
    assert isinstance(answer, PlanExecutionSequenceResponse)
    # Whoever planned it (the model, or A* after the model's answers were refused), the
    # sequence the agent answers with simulates and reaches the beat.
    assert simulate(FACTS, answer.actions, MEANS.goals).ok
    (record,) = list(agent.plans(""))
    plan = agent.record(record.plan_id).plan
    assert plan.provenance is not None
    assert plan.provenance.author in {f"model:{model_server['model']}", "planner:tactical"}
    assert 1 <= len(plan.provenance.calls) <= 2
    for made in plan.provenance.calls:
        assert made.output_tokens > 0
        assert made.finish_reason in {"stop", "length"}
        assert made.outcome  # "accepted", or why not
    # The journal alone re-derives the plan: no model server is asked.
    assert await rederive(planner, "PlanExecutionSequence", REQUEST, plan) == []


async def test_an_unreachable_server_is_a_transient_failure_after_retries() -> None:
    agent = TacticalAgent()
    client = OpenAIModelClient(ModelConfig(url="http://127.0.0.1:9/v1", model="none", timeout_s=2))
    planner = model_planner(agent, client, ModelPlanningConfig(transient_delays_s=(0.01, 0.01)))
    assert planner is not None
    with pytest.raises(TransientError, match=r"unreachable.*tried 3 times"):
        await planner.plan("PlanExecutionSequence", REQUEST, plan_id="goal-1")


async def test_the_strategic_model_proposes_an_arc_against_the_real_server(
    model_server: dict[str, str],
) -> None:
    agent = StrategicAgent()
    planner = model_planner(
        agent, _client(model_server), ModelPlanningConfig(max_repairs=1, max_tokens=160)
    )
    assert isinstance(planner, StrategicModelPlanner)
    agent.use_planner(planner)
    request = PlanNarrativeArcRequest(
        goal="Mira recovers the crown", protagonist="mira", facts=FACTS, beats=2
    )
    answer = await agent.handle("PlanNarrativeArc", request, call("PlanNarrativeArc", "strategic"))
    assert isinstance(answer, PlanNarrativeArcResponse)
    assert len(answer.beats) == 2
    (record,) = list(agent.plans(""))
    plan = agent.record(record.plan_id).plan
    assert plan.provenance is not None
    if plan.provenance.author.startswith("model:"):
        # The model's beats were accepted: the arc check found nothing wrong with them.
        assert answer.template == "proposed"
        assert arc_problems(answer.beats, FACTS, "mira") == []
    else:  # every answer refused: the templates' arc, and each refusal recorded with its reason
        assert plan.provenance.author == "planner:strategic"
        assert all(c.outcome != "accepted" for c in plan.provenance.calls)
    assert 1 <= len(plan.provenance.calls) <= 2
    assert await rederive(planner, "PlanNarrativeArc", request, plan) == []


async def test_the_orchestrator_model_chooses_a_decomposition_against_the_real_server(
    model_server: dict[str, str],
) -> None:
    agents, _ = build_in_memory(entry_points=False)
    orchestrator = agents["orchestrator"]
    planner = model_planner(
        orchestrator, _client(model_server), ModelPlanningConfig(max_repairs=1, max_tokens=96)
    )
    assert isinstance(planner, OrchestratorModelPlanner)
    orchestrator.use_planner(planner)
    goal = SubmitGoalRequest(
        goal="Old Tom goes to the garden",
        passage=(
            "Mira waits in the courtyard. Old Tom sleeps in the great hall. The courtyard leads "
            "to the great hall. The courtyard opens onto the garden."
        ),
        beats=1,
        plan_id="goal-tom",
    )
    failure: FailedPreconditionError | None = None
    try:
        answer = await orchestrator.handle("SubmitGoal", goal, call("SubmitGoal", "orchestrator"))
    except FailedPreconditionError as exc:  # a named, recorded failure: never an unnamed one
        failure = exc
    if failure is not None:
        assert "plan 'goal-tom'" in failure.message
        assert "(logic)" in failure.message
    else:
        assert isinstance(answer, SubmitGoalResponse)
        assert answer.status == "succeeded"
        perception = agents["perception"]
        assert isinstance(perception, PerceptionAgent)
        world = perception.worlds.get(answer.world)
        for beat in answer.beats:
            for fact in beat.goals:
                assert world.holds(fact)
    plan = orchestrator.record("goal-tom").plan
    assert plan.provenance is not None
    assert plan.provenance.calls
    assert all(c.output_tokens > 0 for c in plan.provenance.calls)
