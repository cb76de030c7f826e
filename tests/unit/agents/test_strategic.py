"""The strategic agent: analysis and deterministic HTN-style arcs of exactly N beats."""

from __future__ import annotations

import pytest

from stratagem.agents import ArcChoice, StrategicAgent, StrategicPlan
from stratagem.agents._narrative import (
    decompose,
    find_protagonist,
    measure_tension,
    score_themes,
    select_template,
)
from stratagem.agents._perception import PerceptionAgent
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    Entity,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FailedPreconditionError,
    PlanNarrativeArcRequest,
    PlanNarrativeArcResponse,
    Relation,
)
from tests.unit.agents.conftest import EXAMPLE_NAMES, call, load_goal


def r(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


async def facts_of(name: str) -> tuple[list[Entity], list[Relation]]:
    perception = PerceptionAgent()
    answer = await perception.handle(
        "ExtractEntities",
        ExtractEntitiesRequest(text=load_goal(name).passage),
        call("ExtractEntities", "perception"),
    )
    assert isinstance(answer, ExtractEntitiesResponse)
    return answer.entities, answer.relations


async def arc(agent: StrategicAgent, request: PlanNarrativeArcRequest) -> PlanNarrativeArcResponse:
    answer = await agent.handle("PlanNarrativeArc", request, call("PlanNarrativeArc", "strategic"))
    assert isinstance(answer, PlanNarrativeArcResponse)
    return answer


def test_protagonist_is_most_mentioned_with_ties_to_the_first() -> None:
    people = [
        Entity(id="tom", name="Tom", kind="character"),
        Entity(id="mira", name="Mira", kind="character"),
        Entity(id="hall", name="hall", kind="place"),
    ]
    assert find_protagonist("Tom sat. Mira ran. Mira hid.", people) == "mira"
    assert find_protagonist("Tom sat. Mira ran.", people) == "tom"
    assert find_protagonist("Mira ran. Tom sat.", people) == "mira"
    assert find_protagonist("Nobody here.", people) == ""
    # Without entities, capitalised names stand in.
    assert find_protagonist("The wind blew. Ada ran and Ada hid.", []) == "ada"


def test_themes_and_tension() -> None:
    text = load_goal("crown").passage
    assert score_themes(text) == [("power", 4), ("trust", 2), ("loss", 1)]
    assert score_themes("Nothing at all.") == []
    tension = measure_tension(text)
    assert 0.0 < tension < 1.0
    assert measure_tension("Calm.") == 0.0
    assert measure_tension("Locked! Dark! Storm! Fear!") <= 1.0


async def test_analyze_narrative() -> None:
    entities, _ = await facts_of("crown")
    answer = await StrategicAgent().handle(
        "AnalyzeNarrative",
        AnalyzeNarrativeRequest(text=load_goal("crown").passage, entities=entities),
        call("AnalyzeNarrative", "strategic"),
    )
    assert isinstance(answer, AnalyzeNarrativeResponse)
    assert answer.protagonist == "mira"
    assert answer.themes == ["power", "trust", "loss"]
    assert answer.summary.startswith("A story about mira; themes: power, trust, loss;")


async def test_the_crown_arc_is_means_threshold_prize() -> None:
    _, facts = await facts_of("crown")
    answer = await arc(
        StrategicAgent(),
        PlanNarrativeArcRequest(
            goal="Mira recovers the silver crown", protagonist="mira", facts=facts, beats=3
        ),
    )
    assert answer.template == "locked_quest"
    assert [(b.id, b.title, b.goals) for b in answer.beats] == [
        ("beat_1", "The means", [r("mira", "has", "iron_key")]),
        ("beat_2", "The threshold", [r("mira", "at", "vault")]),
        ("beat_3", "The prize", [r("mira", "has", "silver_crown")]),
    ]


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@pytest.mark.parametrize("beats", range(1, 9))
async def test_arcs_have_exactly_n_beats_and_are_deterministic(name: str, beats: int) -> None:
    goal = load_goal(name)
    _, facts = await facts_of(name)
    protagonist = {"crown": "mira", "lighthouse": "ada", "orchard": "pip"}[name]
    request = PlanNarrativeArcRequest(
        goal=goal.goal, protagonist=protagonist, facts=facts, beats=beats
    )
    first = await arc(StrategicAgent(), request)
    second = await arc(StrategicAgent(), request)
    assert first == second
    assert [b.id for b in first.beats] == [f"beat_{i}" for i in range(1, beats + 1)]
    # The final beat set always contains the template's whole goal.
    all_goals = {g for b in first.beats for g in b.goals}
    final = {
        "crown": r("mira", "has", "silver_crown"),
        "lighthouse": r("ada", "at", "lamp_room"),
        "orchard": r("pip", "has", "golden_apple"),
    }[name]
    assert final in all_goals


def test_fewer_beats_merge_and_more_beats_add_longing_then_aftermath() -> None:
    choice = ArcChoice(
        template="locked_quest",
        protagonist="mira",
        target="crown",
        place="vault",
        key="key",
        wanted=True,
    )
    two = decompose(choice, 2)
    assert [b.title for b in two] == ["The means and the threshold", "The prize"]
    assert two[0].goals == [r("mira", "has", "key"), r("mira", "at", "vault")]
    one = decompose(choice, 1)
    assert one[0].title == "The means, the threshold and the prize"
    five = decompose(choice, 5)
    assert [b.title for b in five] == [
        "The longing",
        "The means",
        "The threshold",
        "The prize",
        "The aftermath",
    ]
    assert five[0].goals == [r("mira", "wants", "crown")]
    assert five[4].goals == five[3].goals


def test_template_selection() -> None:
    facts = [
        r("ada", "at", "jetty"),
        r("jetty", "connected", "tower"),
        r("lamp", "in", "tower"),
        r("ada", "wants", "lamp"),
    ]
    # The goal names a place: a journey; it names nothing: the wanted object.
    assert select_template("Ada climbs the tower", "ada", facts).template == "journey"
    quest = select_template("Ada goes on", "ada", facts)
    assert (quest.template, quest.target, quest.place, quest.key) == ("quest", "lamp", "tower", "")


async def test_a_lock_without_a_key_is_a_clear_failure() -> None:
    facts = [r("mira", "at", "hall"), r("crown", "in", "vault"), r("vault", "locked", "vault")]
    with pytest.raises(FailedPreconditionError) as info:
        await arc(
            StrategicAgent(),
            PlanNarrativeArcRequest(goal="Mira takes the crown", protagonist="mira", facts=facts),
        )
    assert (
        "step 'select' failed (logic): the vault is locked and nothing in the world opens it"
        in (info.value.message)
    )


async def test_a_goal_without_target_is_a_clear_failure() -> None:
    with pytest.raises(FailedPreconditionError, match="names no known object or place"):
        await arc(
            StrategicAgent(),
            PlanNarrativeArcRequest(
                goal="Mira is happy", protagonist="mira", facts=[r("mira", "at", "hall")]
            ),
        )


async def test_arc_plan_has_typed_fields_and_only_strategic_tools() -> None:
    agent = StrategicAgent()
    _, facts = await facts_of("crown")
    await arc(
        agent,
        PlanNarrativeArcRequest(
            goal="Mira recovers the silver crown",
            protagonist="mira",
            facts=facts,
            beats=3,
            themes=["power"],
        ),
    )
    [snapshot] = agent.plans("")
    plan = StrategicPlan.model_validate_json(snapshot.plan_json)
    assert plan.narrative_goals[0].text == "Mira recovers the silver crown"
    assert plan.thematic_elements == ["power"]
    assert [b.id for b in plan.dramatic_beats] == ["beat_1", "beat_2", "beat_3"]
    assert [s.tool for s in plan.steps if s.kind == "tool"] == [
        "select_arc_template",
        "decompose_goal",
    ]
