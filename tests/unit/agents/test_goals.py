"""Goals in plain words (``AskGoal``): intents, the directory, the router and the planner, run in
memory over the example domain (``examples/extensions/assistant.py``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from stratagem.agents import ExtensionError, build_in_memory, import_extensions
from stratagem.agents._a2a import peers_from
from stratagem.agents._goals import (
    CapabilityDirectory,
    GoalPlanner,
    Matcher,
    split_clauses,
    tokens,
)
from stratagem.planning import CrossAgentStep, EngineConfig, GateStep
from stratagem.protocol import (
    CAPABILITIES,
    EXTENSION_FIELD,
    AskGoalRequest,
    AskGoalResponse,
    CapabilitySpec,
    FailedPreconditionError,
    GoalBudget,
    IntentError,
    InvalidArgumentError,
    PermissionDeniedError,
    Policy,
    ProtocolUsageError,
    WireModel,
    parse_intent,
    register_capability,
)
from stratagem.protocol._a2a._client import A2ASkill
from stratagem.runtime.config._settings import A2APeer
from tests.unit.agents.conftest import REPO, call

pytestmark = pytest.mark.usefixtures("clean_registry")

ASSISTANT = "examples.extensions.assistant"
SEED = "check the weather in Seattle and set a timer for 10 minutes"


@pytest.fixture(autouse=True)
def _from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


async def ask(goal: str, **fields: Any) -> AskGoalResponse:
    agents, _ = build_in_memory(extensions=[ASSISTANT], entry_points=False)
    answer = await agents["orchestrator"].handle(
        "AskGoal", AskGoalRequest(goal=goal, **fields), call("AskGoal", "orchestrator")
    )
    assert isinstance(answer, AskGoalResponse)
    return answer


def planner() -> GoalPlanner:
    import_extensions([ASSISTANT])
    return GoalPlanner()


# --- intents --------------------------------------------------------------------------------


class _Timer(WireModel):
    minutes: int
    label: str = ""
    tags: list[str] = []


def _spec(*intents: str) -> CapabilitySpec:
    return CapabilitySpec("Egg", "perception", EXTENSION_FIELD, _Timer, _Timer, intents=intents)


def test_an_intent_parses_into_words_and_typed_slots() -> None:
    intent = parse_intent("set a timer for {minutes} minutes")
    assert intent.slots == ("minutes",)
    assert intent.text == "set a timer for minutes"


@pytest.mark.parametrize(
    ("phrase", "says"),
    [
        ("", "empty phrasing"),
        ("set a timer for {minutes", "unbalanced braces"),
        ("timer {minutes}{label}", "two slots need a word between them"),
        ("{minutes}", "no words besides its slots"),
        ("timer {Minutes}", "not a lowercase identifier"),
    ],
)
def test_an_intent_that_does_not_parse_is_one_line(phrase: str, says: str) -> None:
    with pytest.raises(IntentError, match=says):
        register_capability(_spec(phrase))
    assert "Egg" not in CAPABILITIES


def test_a_slot_not_in_the_request_schema_is_refused_naming_it() -> None:
    with pytest.raises(IntentError) as raised:
        register_capability(_spec("set a timer for {mins} minutes"))
    assert str(raised.value) == (
        "capability 'Egg': intent 'set a timer for {mins} minutes': slot {mins} is not a field "
        "of _Timer (fields: minutes, label, tags)"
    )
    with pytest.raises(IntentError, match=r"slot \{tags\} is not a string, number, boolean"):
        register_capability(_spec("tag it {tags}"))


def test_an_extension_with_a_bad_intent_stops_at_load_in_one_line(tmp_path: Path) -> None:
    source = (REPO / "examples/extensions/assistant.py").read_text(encoding="utf-8")
    bad = tmp_path / "bad_assistant.py"
    bad.write_text(source.replace('"weather in {city}"', '"weather in {town}"'), encoding="utf-8")
    with pytest.raises(ExtensionError) as raised:
        import_extensions([str(bad)])
    message = str(raised.value)
    assert "\n" not in message
    assert "slot {town} is not a field of GetWeatherRequest" in message


def test_the_directory_lists_built_in_and_extension_capabilities_with_intents() -> None:
    import_extensions([ASSISTANT])
    directory = CapabilityDirectory.registered()
    names = [e.name for e in directory.entries]
    assert "perception.ShowWorld" in names
    assert "perception.ResetWorld" in names
    assert {"weather.GetWeather", "timer.SetTimer", "calendar.AddEvent"} <= set(names)
    assert not any(e.agent == "orchestrator" for e in directory.entries)
    assert "AnalyzeNarrative" not in {e.spec.name for e in directory.entries}  # no intents


# --- router and planner ---------------------------------------------------------------------


def test_clauses_split_at_and_then_and_sentence_ends() -> None:
    clauses = split_clauses("Check the weather in Seattle, then set a timer. Also; list the worlds")
    assert [(c.text, c.after_previous) for c in clauses] == [
        ("Check the weather in Seattle", False),
        ("set a timer", True),
        ("Also", False),
        ("list the worlds", False),
    ]
    assert tokens("Setting the timers") == ["set", "timer"]


def test_the_seed_sentence_plans_two_independent_typed_steps() -> None:
    plan = planner().plan(AskGoalRequest(goal=SEED), plan_id="g")
    steps = [s for s in plan.steps if isinstance(s, CrossAgentStep)]
    assert [(s.target, s.capability, s.request, s.depends_on) for s in steps] == [
        ("weather", "GetWeather", {"city": "Seattle"}, []),
        ("timer", "SetTimer", {"minutes": 10}, []),
    ]
    assert [a.score for a in plan.assignments] == [1.0, 1.0]
    assert plan.assignments[0].purpose == (
        "'check the weather in Seattle' matched 'check the weather in {city}'"
    )


def test_an_earlier_output_is_bound_into_a_later_input_and_orders_the_steps() -> None:
    plan = planner().plan(
        AskGoalRequest(goal="find my next meeting and set a timer for it"), plan_id="g"
    )
    timer = plan.steps[1]
    assert isinstance(timer, CrossAgentStep)
    assert timer.request == {"minutes": {"$ref": "next_meeting.minutes"}}
    assert timer.depends_on == ["next_meeting"]


def test_then_orders_and_enum_slots_are_typed() -> None:
    plan = planner().plan(
        AskGoalRequest(goal="schedule dentist on Friday, then what is the weather like in Paris"),
        plan_id="g",
    )
    event, weather = plan.steps
    assert isinstance(event, CrossAgentStep)
    assert isinstance(weather, CrossAgentStep)
    assert event.request == {"title": "dentist", "day": "friday"}
    assert weather.depends_on == ["add_event"]


def test_paraphrases_match_the_same_capability() -> None:
    import_extensions([ASSISTANT])
    matcher = Matcher(CapabilityDirectory.registered())
    for clause in (
        "is it raining in London",
        "weather forecast for Tokyo",
        "how's the weather in Paris",
    ):
        assert matcher.ranked(clause)[0].entry.name == "weather.GetWeather", clause


def test_approve_puts_side_effecting_steps_behind_a_gate() -> None:
    plan = planner().plan(AskGoalRequest(goal=SEED, approve=True), plan_id="g")
    gate, weather, timer = plan.steps
    assert isinstance(gate, GateStep)
    assert gate.id == "approve"
    assert isinstance(weather, CrossAgentStep)
    assert weather.depends_on == []
    assert isinstance(timer, CrossAgentStep)
    assert timer.depends_on == ["approve"]


# --- bad input: one line, nothing runs -------------------------------------------------------


@pytest.mark.parametrize(
    ("goal", "says"),
    [
        (
            "book a flight to Paris",
            "goal: no capability matches 'book a flight to Paris'",
        ),
        (
            "ask the billing agent for my invoice",
            "names the agent 'billing', which is not deployed",
        ),
        (
            "set a timer for 5000 minutes",
            "minutes=5000: Input should be less than or equal to 1440",
        ),
        ("set a timer", "asks timer.SetTimer, which needs 'minutes'"),
    ],
)
def test_a_goal_that_cannot_be_planned_is_refused_in_one_line(goal: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        planner().plan(AskGoalRequest(goal=goal), plan_id="g")
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unmatched_goal_names_the_closest_capabilities() -> None:
    with pytest.raises(InvalidArgumentError, match=r"closest: calendar\.NextMeeting \(0\.\d+\)"):
        planner().plan(AskGoalRequest(goal="book a meeting room"), plan_id="g")


@pytest.mark.parametrize("goal", ["", "   ", "x" * 100_000])
def test_an_empty_or_huge_goal_is_refused_by_the_schema(goal: str) -> None:
    with pytest.raises(ValidationError) as raised:
        AskGoalRequest(goal=goal)
    assert raised.value.errors()[0]["loc"] == ("goal",)


# --- run in memory: the seed's example, its failing-weather variant ---------------------------


async def test_the_seed_example_runs_and_summarises() -> None:
    answer = await ask(SEED)
    assert (answer.status, answer.route, answer.revisions) == ("succeeded", "plan", 1)
    assert [(s.id, s.status) for s in answer.steps] == [
        ("get_weather", "succeeded"),
        ("set_timer", "succeeded"),
    ]
    assert json.loads(answer.steps[0].output_json)["summary"] == "Seattle: 52°F, partly cloudy"
    assert answer.summary.splitlines() == [
        "done: check the weather in Seattle: Seattle: 52°F, partly cloudy",
        f"done: set a timer for 10 minutes: {json.loads(answer.steps[1].output_json)['summary']}",
    ]


async def test_a_failed_step_is_replanned_and_the_independent_rest_runs() -> None:
    answer = await ask("check the weather in Atlantis and set a timer for 10 minutes")
    assert (answer.status, answer.revisions) == ("partial", 2)
    weather, timer = answer.steps
    assert (weather.status, timer.status) == ("dropped", "succeeded")
    assert weather.error == (
        "get_weather failed: no weather for 'Atlantis': the weather service does not know it"
    )
    assert answer.summary.splitlines()[0].startswith("not done: check the weather in Atlantis")
    assert answer.summary.splitlines()[1].startswith("done: set a timer for 10 minutes")


@pytest.mark.parametrize(
    ("city", "breaker", "failure_class", "why"),
    [
        ("Atlantis", True, "logic", "the weather service does not know it"),
        ("Vostok", False, "transient", "the weather station is offline"),
        ("Kerguelen", False, "timeout", "the weather station did not answer in time"),
        # With the weather agent's circuit breaker (the default) the outage's retries open it:
        # the last attempt is refused without a call, a policy failure.
        ("Vostok", True, "policy", "circuit open for tool 'current_weather'"),
    ],
)
async def test_the_timer_is_set_whatever_class_the_weather_failed_with(
    city: str, breaker: bool, failure_class: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A transient or timeout failure is retried first; once its retries are spent the goal is
    # replanned around it exactly as around a refusal (before: the whole goal failed).
    config = EngineConfig() if breaker else EngineConfig(circuit_breaker=None)
    agents, _ = build_in_memory(extensions=[ASSISTANT], entry_points=False, engine_config=config)
    answer = await agents["orchestrator"].handle(
        "AskGoal",
        AskGoalRequest(goal=f"check the weather in {city} and set a timer for 10 minutes"),
        call("AskGoal", "orchestrator"),
    )
    assert isinstance(answer, AskGoalResponse)
    assert (answer.status, answer.revisions) == ("partial", 2)
    weather, timer = answer.steps
    assert (weather.status, timer.status) == ("dropped", "succeeded")
    assert weather.error.startswith("get_weather failed: ")
    assert why in weather.error
    # The orchestrator's step failed for good with the class its agent's failure had.
    assert f"step get_weather failed ({failure_class})" in caplog.text
    assert answer.summary.splitlines()[1].startswith("done: set a timer for 10 minutes")


async def test_a_dependent_step_is_dropped_with_the_failed_one() -> None:
    with pytest.raises(FailedPreconditionError, match="no weather for 'Atlantis'"):
        await ask("check the weather in Atlantis then set a timer for 10 minutes")


async def test_plan_only_runs_nothing_and_shows_the_dag() -> None:
    answer = await ask("find my next meeting and set a timer for it", plan_only=True)
    assert (answer.status, answer.route) == ("planned", "plan")
    assert [(s.agent, s.capability, s.depends_on, s.score) for s in answer.steps] == [
        ("calendar", "NextMeeting", [], 1.0),
        ("timer", "SetTimer", ["next_meeting"], 1.0),
    ]
    assert json.loads(answer.steps[1].request_json) == {"minutes": {"$ref": "next_meeting.minutes"}}
    assert answer.steps[1].side_effects is True
    assert all(s.output_json == "" for s in answer.steps)


async def test_one_clause_is_the_single_route() -> None:
    answer = await ask("what is the weather like in Tokyo")
    assert (answer.status, answer.route, len(answer.steps)) == ("succeeded", "single", 1)


def test_a_list_of_clauses_splits_at_commas_and_please_is_dropped() -> None:
    goal = "check the weather in London, set a timer for 10 minutes and schedule gym on Monday"
    assert [c.text for c in split_clauses(goal)] == [
        "check the weather in London",
        "set a timer for 10 minutes",
        "schedule gym on Monday",
    ]
    assert [c.text for c in split_clauses("please set a timer for 5 minutes, please")] == [
        "set a timer for 5 minutes"
    ]
    plan = planner().plan(AskGoalRequest(goal=goal), plan_id="g")
    assert [s.id for s in plan.steps] == ["get_weather", "set_timer", "add_event"]


def test_a_piece_that_is_no_clause_is_joined_back_as_written() -> None:
    plan = planner().plan(
        AskGoalRequest(goal="schedule lunch with Sam, Ann and Bo on Tuesday"), plan_id="g"
    )
    [event] = plan.steps
    assert isinstance(event, CrossAgentStep)
    assert event.request == {"title": "lunch with Sam, Ann and Bo", "day": "tuesday"}


async def test_with_approve_the_side_effecting_step_waits_for_the_gate() -> None:
    agents, _ = build_in_memory(extensions=[ASSISTANT], entry_points=False)
    orchestrator = agents["orchestrator"]
    request = AskGoalRequest(goal=SEED, approve=True, plan_id="held")
    run = asyncio.create_task(
        orchestrator.handle("AskGoal", request, call("AskGoal", "orchestrator"))
    )
    async for event in orchestrator.watch("held"):
        if event.plan_id == "held" and not event.step_id and event.status == "blocked":
            break
    assert not run.done()
    await asyncio.sleep(0.5)  # time for a step that did not wait to reach its agent
    # The timer (side effects) waits for the gate; nothing was asked of its agent.
    assert agents["timer"].plans("held/set_timer") == []
    await orchestrator.decide_gate(
        "held", "approve", approve=True, approver="operator", rationale="ok"
    )
    answer = await asyncio.wait_for(run, 30)
    assert isinstance(answer, AskGoalResponse)
    assert answer.status == "succeeded"
    assert [(s.id, s.status) for s in answer.steps] == [
        ("approve", "succeeded"),
        ("get_weather", "succeeded"),
        ("set_timer", "succeeded"),
    ]


async def test_a_policy_rule_holds_the_side_effecting_steps_of_every_goal() -> None:
    # The goal does not ask for an approval; the policy's [goals] makes it wait all the same.
    agents, _ = build_in_memory(extensions=[ASSISTANT], entry_points=False)
    orchestrator = agents["orchestrator"]
    orchestrator.use_policy(
        Policy.from_toml("[goals]\napprove_side_effects = true\n", source="goals.toml")
    )
    request = AskGoalRequest(goal=SEED, plan_id="ruled")
    run = asyncio.create_task(
        orchestrator.handle("AskGoal", request, call("AskGoal", "orchestrator"))
    )
    async for event in orchestrator.watch("ruled"):
        if event.plan_id == "ruled" and not event.step_id and event.status == "blocked":
            break
    await asyncio.sleep(0.5)  # time for a step that did not wait to reach its agent
    assert not run.done()
    assert agents["timer"].plans("ruled/set_timer") == []
    await orchestrator.decide_gate(
        "ruled", "approve", approve=True, approver="operator", rationale="ok"
    )
    answer = await asyncio.wait_for(run, 30)
    assert isinstance(answer, AskGoalResponse)
    assert [(s.id, s.status) for s in answer.steps] == [
        ("approve", "succeeded"),
        ("get_weather", "succeeded"),
        ("set_timer", "succeeded"),
    ]


def test_the_goals_table_of_the_policy_is_checked() -> None:
    assert not Policy.from_toml("").approve_goal_side_effects
    with pytest.raises(ProtocolUsageError, match=r"goals\.approve_side_effect"):
        Policy.from_toml("[goals]\napprove_side_effect = true\n")


def _external_planner(*skills: A2ASkill) -> GoalPlanner:
    goals = planner()
    goals.use_external({"concierge": list(skills)})
    return goals


def test_an_external_skill_has_side_effects_unless_declared_read_only() -> None:
    booking = A2ASkill("book", ("book a table at a restaurant",))
    goals = _external_planner(booking)
    plan = goals.plan(
        AskGoalRequest(goal="book a table at a restaurant", approve=True), plan_id="g"
    )
    gate, ask_step = plan.steps
    assert isinstance(gate, GateStep)
    assert "a2a.concierge.book" in gate.prompt
    assert ask_step.depends_on == ["approve"]
    shown = goals.plan(
        AskGoalRequest(goal="book a table at a restaurant", plan_only=True), plan_id="p"
    )
    assert shown.steps[0].input["steps"][0]["id"] == "ask_concierge"  # type: ignore[union-attr]

    reading = A2ASkill("menu", ("read the menu of a restaurant",), side_effects=False)
    plan = _external_planner(reading).plan(
        AskGoalRequest(goal="read the menu of a restaurant", approve=True), plan_id="g"
    )
    assert [s.id for s in plan.steps] == ["ask_concierge"]


async def test_a_configured_agents_read_only_skills_reach_its_card_reading() -> None:
    peers = peers_from({"concierge": A2APeer(url="http://127.0.0.1:9/", read_only_skills=["menu"])})
    assert peers["concierge"].read_only_skills == ("menu",)


# --- the request's deadline, budget and definition of done ------------------------------------


def test_the_goals_deadline_and_budget_become_its_plans() -> None:
    request = AskGoalRequest(
        goal=SEED, deadline_s=30, budget=GoalBudget(wall_time_s=60, tool_calls=5, cost_units=9)
    )
    before = time.time()
    plan = planner().plan(request, plan_id="g")
    assert plan.budget is not None
    assert (plan.budget.wall_time_s, plan.budget.tool_calls, plan.budget.cost_units) == (30, 5, 9)
    assert plan.deadline is not None
    assert before + 30 <= plan.deadline <= time.time() + 30
    assert planner().plan(AskGoalRequest(goal=SEED), plan_id="g").budget is None


async def test_a_goal_out_of_budget_stops_and_is_not_replanned() -> None:
    # Two cross-agent steps, one call allowed: the second is refused before it is sent.
    with pytest.raises(PermissionDeniedError, match="budget exhausted: tool_calls 1/1"):
        await ask(SEED, budget=GoalBudget(tool_calls=1))


async def test_the_definition_of_done_is_checked_and_stated() -> None:
    failing = "check the weather in Atlantis and set a timer for 10 minutes"
    met = await ask(failing, done_when=["SetTimer"])
    assert (met.status, met.done) == ("partial", True)
    assert met.summary.splitlines()[-1] == "definition of done: met (SetTimer)"
    unmet = await ask(failing, done_when=["timer.SetTimer", "get_weather"])
    assert (unmet.status, unmet.done) == ("partial", False)
    assert unmet.summary.splitlines()[-1] == "definition of done: not met: get_weather dropped"
    assert (await ask(SEED)).done is None


def test_a_definition_of_done_naming_no_planned_step_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="done_when: 'BookFlight' names no step"):
        planner().plan(AskGoalRequest(goal=SEED, done_when=["BookFlight"]), plan_id="g")


@pytest.mark.parametrize("field", ["constraints", "definition_of_done", "deadline"])
def test_a_field_the_goal_does_not_take_is_refused_naming_it(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        AskGoalRequest.model_validate({"goal": SEED, field: "by noon"})


@pytest.mark.parametrize(
    ("goal", "unplaced"),
    [
        ("check the weather in Paris and book a table", "book a table"),
        ("schedule gym on Monday and buy milk", "buy milk"),
        ("check the weather in Paris and Tokyo", "Tokyo"),
    ],
)
def test_a_clause_nothing_matches_after_a_complete_one_is_refused_by_name(
    goal: str, unplaced: str
) -> None:
    # Before: the piece was joined into the previous clause's text slot (city='Paris and book a
    # table'), and the step failed when it ran.
    with pytest.raises(InvalidArgumentError, match=f"no capability matches '{unplaced}'"):
        planner().plan(AskGoalRequest(goal=goal), plan_id="g")
