"""Model planning against the real embedded model server (llama.cpp, Gemma 3 270M): every
accepted plan is valid whatever the model says, every call is journaled, and the journal re-derives
the plan with no model at all. Few, small calls: the benchmark is where the goal suite runs."""

from __future__ import annotations

import pytest

from stratagem.agents import (
    ModelConfig,
    ModelPlanningConfig,
    OpenAIModelClient,
    TacticalAgent,
    model_planner,
    rederive,
)
from stratagem.agents._actions import simulate
from stratagem.planning import TransientError
from stratagem.protocol import PlanExecutionSequenceRequest, PlanExecutionSequenceResponse
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
