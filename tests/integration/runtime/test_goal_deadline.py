"""A goal's deadline fits the deployment's planners, and a goal that runs out of time says where
the time went: the four agents served over gRPC on 127.0.0.1 (``_served``), the tactical agent
planning with a model that never answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stratagem.agents import ChatRequest, ChatResponse, model_planner
from stratagem.protocol import DeadlineExceededError, SubmitGoalRequest
from stratagem.runtime.operator._goal import goal_deadline_s
from tests.integration.runtime._served import Served, serve
from tests.unit.agents.conftest import load_goal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class SilentModel:
    """A model server that takes every call and never answers."""

    model = "silent"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        await asyncio.Event().wait()
        raise AssertionError("never answers")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    running = await serve(tmp_path / "state")
    assert running.agents is not None
    tactical = running.agents["tactical"]
    planner = model_planner(tactical, SilentModel())
    assert planner is not None
    tactical.use_planner(planner)
    tactical.planning_timeout_s = 1.5
    yield running
    await running.stop()


def _goal(plan_id: str) -> SubmitGoalRequest:
    return load_goal("crown").model_copy(update={"plan_id": plan_id, "beats": 1})


async def test_the_cards_say_how_each_agent_plans_and_the_default_deadline_follows(
    served: Served,
) -> None:
    async with served.operator() as operator:
        cards = {role: await operator.describe(role) for role in served.endpoints}
    assert {role: card.planner for role, card in cards.items()} == {
        "orchestrator": "deterministic",
        "perception": "deterministic",
        "strategic": "deterministic",
        "tactical": "model",
    }
    assert cards["tactical"].planning_timeout_s == 1.5
    base = served.settings.request_timeout_s
    assert goal_deadline_s(base, cards, _goal("g")) == base + 1.5
    three_beats = _goal("g").model_copy(update={"beats": 3})
    assert goal_deadline_s(base, cards, three_beats) == base + 4.5


async def test_a_goal_out_of_time_says_where_it_was_waiting_and_what_to_raise(
    served: Served,
) -> None:
    async with served.operator() as operator:
        with pytest.raises(DeadlineExceededError) as caught:
            await operator.submit(_goal("goal-slow"), timeout=2.0)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith("goal goal-slow: the 2 s deadline passed while ")
    assert (
        "step 'beat_1' of goal-slow waited on tactical.PlanExecutionSequence: the tactical "
        "agent was still planning goal-slow/beat_1 with its model (waiting on the model server)"
    ) in message
    assert "--timeout SECONDS" in message
    assert "STRATAGEM_MODEL_TIMEOUT_S" in message
