"""A goal's deadline fits the deployment's planners, as the deployment already knows them (no
agent is asked), and a goal that runs out of time says where the time went: the four agents served
over gRPC on 127.0.0.1 (``_served``), the tactical agent planning with a model that never answers.
The RPCs a ``submit`` makes are counted in the agents' audit log."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stratagem.agents import ChatRequest, ChatResponse, model_planner
from stratagem.protocol import DeadlineExceededError, InMemoryAuditLog, SubmitGoalRequest
from stratagem.runtime.config._deployed import DeploymentRecord, write_record
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
def audit() -> InMemoryAuditLog:
    return InMemoryAuditLog()


@pytest.fixture
async def served(tmp_path: Path, audit: InMemoryAuditLog) -> AsyncIterator[Served]:
    running = await serve(tmp_path / "state", audit=audit)
    assert running.agents is not None
    # The deployment's settings: the tactical agent plans with a model, 2 x 0.75 s a request.
    running.settings = running.settings.model_copy(
        update={"planners": {"tactical": "model"}, "model_timeout_s": 0.75, "model_max_repairs": 1}
    )
    tactical = running.agents["tactical"]
    planner = model_planner(tactical, SilentModel())
    assert planner is not None
    tactical.use_planner(planner)
    tactical.planning_timeout_s = running.settings.planning_timeout_s("tactical")
    yield running
    await running.stop()


def _operators_calls(audit: InMemoryAuditLog, after: int = 0) -> Counter[str]:
    """The RPCs the operator made (each accepted call, by capability), after the first ``after``
    records."""
    return Counter(
        record.capability
        for record in list(audit.records())[after:]
        if record.actor == "operator" and record.action == "call.accepted"
    )


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
    from stratagem.runtime.operator._goal import planning_timeouts

    # The same numbers, from the deployment's settings: no card is read for them.
    planning = planning_timeouts(served.settings, tuple(served.endpoints))
    assert planning == {role: card.planning_timeout_s for role, card in cards.items()}
    base = served.settings.request_timeout_s
    assert goal_deadline_s(base, planning, _goal("g")) == base + 1.5
    three_beats = _goal("g").model_copy(update={"beats": 3})
    assert goal_deadline_s(base, planning, three_beats) == base + 4.5


async def test_a_submit_asks_no_agent_for_its_deadline(tmp_path: Path) -> None:
    audit = InMemoryAuditLog()
    plain = await serve(tmp_path / "state", audit=audit)  # every agent plans with its rules
    try:
        async with plain.operator() as operator:
            await operator.endpoints()  # the endpoints proved (not audited: no call)
            before = len(list(audit.records()))
            outcome = await operator.submit(_goal("goal-counted"))
    finally:
        await plain.stop()
    assert outcome.plan_id == "goal-counted"
    # Before: Describe x 4 (the cards, for the deadline), then SubmitGoal and Plans x 4.
    assert _operators_calls(audit, before) == {"SubmitGoal": 1, "Plans": 4}


async def test_the_deadline_follows_what_up_recorded_not_the_shells_settings(
    served: Served, audit: InMemoryAuditLog
) -> None:
    # The shell knows nothing of the model (its settings: every agent plans with its rules); the
    # record `stratagem up` wrote says the tactical agent may take 1.5 s a request.
    recorded = {role: 0.0 for role in served.endpoints} | {"tactical": 1.5}
    write_record(served.settings.state_dir, DeploymentRecord(planning_timeout_s=recorded))
    served.settings = served.settings.model_copy(update={"planners": {}, "request_timeout_s": 1.0})
    async with served.operator() as operator:
        await operator.endpoints()
        before = len(list(audit.records()))
        with pytest.raises(DeadlineExceededError) as caught:
            await operator.submit(_goal("goal-recorded"))
    message = caught.value.message
    # 1 s (STRATAGEM_REQUEST_TIMEOUT_S) + 1.5 s for the one beat the tactical agent plans.
    assert message.startswith("goal goal-recorded: the 2.5 s deadline passed while ")
    assert "was still planning goal-recorded/beat_1 with its model" in message
    # The goal's plans are asked where it was; the cards are not (before: Describe x 4 twice).
    assert _operators_calls(audit, before) == {"SubmitGoal": 1, "Plans": 4}


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
