"""The model route of a goal in plain words (``agents/_goals/_model.py``): the directory as the
answer schema's only choices, the answer validated as the router's choice is, repairs, the
deterministic fallback, and the goal planner's replanning kept. A scripted model answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stratagem.agents import ModelPlanningConfig, ScriptedModelClient, build_in_memory
from stratagem.agents._model_roles import model_planner
from stratagem.protocol import AskGoalRequest, AskGoalResponse, InvalidArgumentError
from stratagem.protocol._a2a._client import A2ASkill
from tests.unit.agents.conftest import REPO, call

pytestmark = pytest.mark.usefixtures("clean_registry")

SEED = "check the weather in Seattle and set a timer for 10 minutes"


@pytest.fixture(autouse=True)
def _from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _steps(*steps: tuple[str, str, dict[str, Any], list[int]]) -> str:
    return json.dumps(
        {"steps": [{"capability": c, "clause": t, "slots": s, "after": a} for c, t, s, a in steps]}
    )


WEATHER = ("weather.GetWeather", "check the weather in Seattle", {"city": "Seattle"}, [])
TIMER = ("timer.SetTimer", "set a timer for 10 minutes", {"minutes": 10}, [])


async def _ask(
    script: list[object], goal: str = SEED, **config: Any
) -> tuple[AskGoalResponse, ScriptedModelClient, Any]:
    agents, _ = build_in_memory(extensions=["examples.extensions.assistant"], entry_points=False)
    orchestrator = agents["orchestrator"]
    client = ScriptedModelClient(script, model="tiny")
    planner = model_planner(orchestrator, client, ModelPlanningConfig(**config))
    assert planner is not None
    orchestrator.use_planner(planner)
    answer = await orchestrator.handle(
        "AskGoal", AskGoalRequest(goal=goal), call("AskGoal", "orchestrator")
    )
    assert isinstance(answer, AskGoalResponse)
    return answer, client, orchestrator


async def test_the_model_chooses_from_the_directory_only_and_its_plan_runs() -> None:
    answer, client, _orchestrator = await _ask([_steps(WEATHER, TIMER)])
    assert len(client.requests) == 1  # asked once, its answer taken
    assert answer.status == "succeeded"
    assert [(s.capability, json.loads(s.request_json)) for s in answer.steps] == [
        ("GetWeather", {"city": "Seattle"}),
        ("SetTimer", {"minutes": 10}),
    ]
    assert answer.steps[0].why.endswith(
        "the model chose it (its best intent: 'check the weather in {city}')"
    )
    assert answer.steps[0].score == 1.0
    schema = client.requests[0].schema
    assert schema is not None
    choices = schema["properties"]["steps"]["items"]["properties"]["capability"]["enum"]
    assert {"weather.GetWeather", "timer.SetTimer", "calendar.AddEvent"} <= set(choices)
    assert not any(c.startswith("orchestrator.") for c in choices)
    assert "- timer.SetTimer: slots minutes (integer), label (string)" in (
        client.requests[0].messages[-1].content
    )


async def test_an_answer_outside_the_directory_or_the_schema_is_repaired() -> None:
    bad_capability = _steps(("billing.Pay", "pay", {}, []))
    bad_slot = _steps(("timer.SetTimer", "set a timer for 10 minutes", {"mins": 10}, []))
    bad_value = _steps(("timer.SetTimer", "set a timer for 10 minutes", {"minutes": 5000}, []))
    answer, client, _ = await _ask(
        [bad_capability, bad_slot, bad_value, _steps(WEATHER, TIMER)], max_repairs=3
    )
    assert answer.status == "succeeded"
    critiques = [r.messages[-1].content for r in client.requests[1:]]
    assert "'billing.Pay' is not a capability of the directory" in critiques[0]
    assert "mins not among timer.SetTimer's slots (minutes, label)" in critiques[1]
    assert "minutes=5000: Input should be less than or equal to 1440" in critiques[2]


async def test_when_no_answer_passes_the_router_plans_it() -> None:
    answer, client, _ = await _ask(
        ["not json", _steps(("billing.Pay", "x", {}, []))], max_repairs=1
    )
    assert client.remaining == 0
    assert answer.status == "succeeded"
    assert [s.why for s in answer.steps] == [
        "'check the weather in Seattle' matched 'check the weather in {city}'",
        "'set a timer for 10 minutes' matched 'set a timer for {minutes} minutes'",
    ]


async def test_the_goal_planner_still_replans_a_model_plan() -> None:
    weather = ("weather.GetWeather", "check the weather in Atlantis", {"city": "Atlantis"}, [])
    answer, _, _ = await _ask(
        [_steps(weather, TIMER)],
        goal="check the weather in Atlantis and set a timer for 10 minutes",
    )
    assert (answer.status, answer.revisions) == ("partial", 2)
    assert [s.status for s in answer.steps] == ["dropped", "succeeded"]


async def test_model_steps_wait_for_the_steps_they_name_and_outputs_are_bound() -> None:
    meeting = ("calendar.NextMeeting", "find my next meeting", {}, [])
    timer = ("timer.SetTimer", "set a timer for it", {}, [1])
    answer, _, _orchestrator = await _ask(
        [_steps(meeting, timer)], goal="find my next meeting and set a timer for it"
    )
    assert answer.status == "succeeded"
    assert json.loads(answer.steps[1].request_json) == {"minutes": {"$ref": "next_meeting.minutes"}}
    assert answer.steps[1].depends_on == ["next_meeting"]
    assert json.loads(answer.steps[1].output_json)["minutes"] == 25


async def test_an_agent_not_deployed_is_refused_before_the_model_is_asked() -> None:
    with pytest.raises(InvalidArgumentError, match="names the agent 'billing'"):
        await _ask([], goal="ask the billing agent to pay my invoice")


async def test_a_valid_but_wrong_choice_or_words_not_in_the_goal_are_refused() -> None:
    wrong = _steps(("perception.ListWorlds", "check the weather in Seattle", {}, []))
    invented = _steps(("timer.SetTimer", "Timer.SetTimer", {"minutes": 10}, []))
    answer, client, _ = await _ask([wrong, invented, _steps(WEATHER, TIMER)], max_repairs=2)
    assert answer.status == "succeeded"
    critiques = [r.messages[-1].content for r in client.requests[1:]]
    assert (
        "'check the weather in Seattle' does not match perception.ListWorlds's intents "
        "(list the worlds, which worlds are there, list worlds starting {prefix}); "
        "closest: weather.GetWeather"
    ) in critiques[0]
    assert "the clause 'Timer.SetTimer' is not the goal's words" in critiques[1]


async def test_external_a2a_skills_are_offered_to_the_model_as_to_the_router() -> None:
    agents, _ = build_in_memory(extensions=["examples.extensions.assistant"], entry_points=False)
    orchestrator = agents["orchestrator"]
    booking = ("a2a.concierge.book", "book a table at a restaurant", {}, [])
    client = ScriptedModelClient([_steps(WEATHER, booking)], model="tiny")
    planner = model_planner(orchestrator, client, ModelPlanningConfig())
    assert planner is not None
    orchestrator.use_planner(planner)
    # The external agent's card (read by the orchestrator before a goal): its skill's examples.
    planner.deterministic.goals.use_external(
        {"concierge": [A2ASkill("book", ("book a table at a restaurant",))]}
    )
    answer = await orchestrator.handle(
        "AskGoal",
        AskGoalRequest(goal=f"{SEED.split(' and ')[0]} and book a table at a restaurant",
                       plan_only=True),
        call("AskGoal", "orchestrator"),
    )  # fmt: skip
    assert isinstance(answer, AskGoalResponse)
    schema = client.requests[0].schema
    assert schema is not None
    choices = schema["properties"]["steps"]["items"]["properties"]["capability"]["enum"]
    assert "a2a.concierge.book" in choices
    assert "- a2a.concierge.book: slots none; e.g. book a table at a restaurant" in (
        client.requests[0].messages[-1].content
    )
    assert [(s.agent, s.capability) for s in answer.steps] == [
        ("weather", "GetWeather"),
        ("concierge", "book"),
    ]
    assert answer.steps[1].why.endswith(
        "the model chose it (its best intent: 'book a table at a restaurant')"
    )
    assert json.loads(answer.steps[1].request_json) == {
        "agent": "concierge",
        "skill": "book",
        "text": "book a table at a restaurant",
    }
