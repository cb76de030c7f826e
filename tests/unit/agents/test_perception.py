"""The perception agent: rule-based extraction, spatial context and world updates."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.agents import (
    DEFAULT_PATTERNS,
    FileWorldStore,
    PerceptionAgent,
    PerceptionPlan,
    slugify,
)
from stratagem.agents._extract import match_sentence, resolve_mentions, split_sentences
from stratagem.protocol import (
    Action,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FailedPreconditionError,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
    Relation,
    SpatialContext,
    UpdateWorldStateRequest,
    UpdateWorldStateResponse,
)
from tests.unit.agents.conftest import call, load_goal

EXPECTED = {
    "crown": (
        [
            ("mira", "character"),
            ("courtyard", "place"),
            ("silver_crown", "object"),
            ("vault", "place"),
            ("iron_key", "object"),
            ("garden", "place"),
            ("great_hall", "place"),
            ("old_tom", "character"),
        ],
        [
            ("mira", "at", "courtyard"),
            ("mira", "wants", "silver_crown"),
            ("silver_crown", "in", "vault"),
            ("vault", "locked", "vault"),
            ("iron_key", "in", "garden"),
            ("iron_key", "opens", "vault"),
            ("courtyard", "connected", "great_hall"),
            ("great_hall", "connected", "vault"),
            ("courtyard", "connected", "garden"),
            ("old_tom", "at", "great_hall"),
            ("mira", "knows", "old_tom"),
        ],
    ),
    "lighthouse": (
        [
            ("ada", "character"),
            ("jetty", "place"),
            ("boathouse", "place"),
            ("lighthouse", "place"),
            ("stair", "place"),
            ("lamp_room", "place"),
            ("brass_key", "object"),
            ("lantern", "object"),
        ],
        [
            ("ada", "at", "jetty"),
            ("jetty", "connected", "boathouse"),
            ("jetty", "connected", "lighthouse"),
            ("lighthouse", "connected", "stair"),
            ("stair", "connected", "lamp_room"),
            ("lamp_room", "locked", "lamp_room"),
            ("brass_key", "in", "boathouse"),
            ("brass_key", "opens", "lamp_room"),
            ("lantern", "in", "lamp_room"),
            ("ada", "wants", "lantern"),
        ],
    ),
    "orchard": (
        [
            ("pip", "character"),
            ("cottage", "place"),
            ("golden_apple", "object"),
            ("basket", "object"),
            ("lane", "place"),
            ("orchard", "place"),
            ("mill", "place"),
            ("copper_key", "object"),
            ("old_bran", "character"),
        ],
        [
            ("pip", "at", "cottage"),
            ("pip", "wants", "golden_apple"),
            ("pip", "has", "basket"),
            ("cottage", "connected", "lane"),
            ("lane", "connected", "orchard"),
            ("lane", "connected", "mill"),
            ("orchard", "locked", "orchard"),
            ("copper_key", "in", "mill"),
            ("copper_key", "opens", "orchard"),
            ("old_bran", "at", "orchard"),
            ("old_bran", "has", "golden_apple"),
            ("pip", "knows", "old_bran"),
        ],
    ),
}


def r(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


async def extract(agent: PerceptionAgent, text: str) -> ExtractEntitiesResponse:
    answer = await agent.handle(
        "ExtractEntities", ExtractEntitiesRequest(text=text), call("ExtractEntities", "perception")
    )
    assert isinstance(answer, ExtractEntitiesResponse)
    return answer


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_example_passages_give_exact_entities_and_relations(name: str) -> None:
    agent = PerceptionAgent()
    answer = await extract(agent, load_goal(name).passage)
    entities, relations = EXPECTED[name]
    assert [(e.id, e.kind) for e in answer.entities] == entities
    assert [(f.subject, f.predicate, f.object) for f in answer.relations] == relations
    assert answer.world_version == 1
    assert agent.world.facts() == answer.relations


@pytest.mark.parametrize(
    ("sentence", "fact"),
    [
        ("Mira stood in the north tower", ("mira", "at", "north_tower")),
        ("Old Tom waits at the gate", ("old_tom", "at", "gate")),
        ("The iron key hangs in the north tower", ("iron_key", "in", "north_tower")),
        ("The courtyard leads into the great hall", ("courtyard", "connected", "great_hall")),
        ("The hall opened onto the garden", ("hall", "connected", "garden")),
        ("Mira carried the lantern", ("mira", "has", "lantern")),
        ("The iron key opens the vault", ("iron_key", "opens", "vault")),
        ("The vault was locked", ("vault", "locked", "vault")),
        ("Mira longs for the crown", ("mira", "wants", "crown")),
        ("Mira knows Old Tom", ("mira", "knows", "old_tom")),
    ],
)
def test_each_pattern(sentence: str, fact: tuple[str, str, str]) -> None:
    mention = match_sentence(0, sentence, DEFAULT_PATTERNS)
    assert mention is not None
    _, relations = resolve_mentions([mention])
    assert [(f.subject, f.predicate, f.object) for f in relations] == [fact]


def test_sentences_no_pattern_knows_are_ignored() -> None:
    for sentence in ("Long ago the crown was lost", "The storm grows darker", "It rains"):
        assert match_sentence(0, sentence, DEFAULT_PATTERNS) is None


def test_split_sentences_and_slugify() -> None:
    assert split_sentences("Mira waits.  The key  lies in the hall!\n\nWho knows?") == [
        "Mira waits",
        "The key lies in the hall",
        "Who knows",
    ]
    assert slugify("North Tower") == "north_tower"
    assert slugify("Old  Tom's") == "old_tom_s"
    assert slugify("7 seas") == "e_7_seas"


def test_head_noun_resolution_and_exact_resolution() -> None:
    sentences = ["The iron key lies in the garden", "The key opens the vault"]
    mentions = [m for i, s in enumerate(sentences) if (m := match_sentence(i, s, DEFAULT_PATTERNS))]
    _, head = resolve_mentions(mentions, "head_noun")
    assert r("iron_key", "opens", "vault") in head
    entities, exact = resolve_mentions(mentions, "exact")
    assert r("key", "opens", "vault") in exact
    assert {e.id for e in entities} == {"iron_key", "garden", "key", "vault"}


async def test_find_spatial_context_returns_contexts_and_all_facts() -> None:
    agent = PerceptionAgent()
    await extract(agent, load_goal("crown").passage)
    answer = await agent.handle(
        "FindSpatialContext",
        FindSpatialContextRequest(entity_ids=["mira", "courtyard", "iron_key"]),
        call("FindSpatialContext", "perception"),
    )
    assert isinstance(answer, FindSpatialContextResponse)
    assert answer.contexts == [
        SpatialContext(entity_id="mira", location="courtyard"),
        SpatialContext(
            entity_id="courtyard", contains=["mira"], neighbours=["great_hall", "garden"]
        ),
        SpatialContext(entity_id="iron_key", location="garden"),
    ]
    assert answer.facts == agent.world.facts()


MOVE = Action(
    name="move",
    args=["mira", "courtyard", "garden"],
    preconditions=[r("mira", "at", "courtyard"), r("courtyard", "connected", "garden")],
    adds=[r("mira", "at", "garden")],
    deletes=[r("mira", "at", "courtyard")],
)


async def test_update_world_state_applies_and_dry_runs() -> None:
    agent = PerceptionAgent()
    await extract(agent, load_goal("crown").passage)
    dry = await agent.handle(
        "UpdateWorldState",
        UpdateWorldStateRequest(actions=[MOVE], dry_run=True),
        call("UpdateWorldState", "perception"),
    )
    assert isinstance(dry, UpdateWorldStateResponse)
    assert dry.added == [r("mira", "at", "garden")]
    assert agent.world.holds(r("mira", "at", "courtyard"))
    done = await agent.handle(
        "UpdateWorldState",
        UpdateWorldStateRequest(actions=[MOVE]),
        call("UpdateWorldState", "perception"),
    )
    assert isinstance(done, UpdateWorldStateResponse)
    assert done.removed == [r("mira", "at", "courtyard")]
    assert done.world_version == 2
    assert agent.world.holds(r("mira", "at", "garden"))


async def test_update_world_state_failure_is_failed_precondition_naming_the_fact() -> None:
    agent = PerceptionAgent()
    await extract(agent, load_goal("crown").passage)
    into_vault = Action(
        name="move",
        args=["mira", "courtyard", "vault"],
        preconditions=[r("mira", "at", "courtyard"), r("courtyard", "connected", "vault")],
        adds=[r("mira", "at", "vault")],
        deletes=[r("mira", "at", "courtyard")],
    )
    with pytest.raises(FailedPreconditionError) as info:
        await agent.handle(
            "UpdateWorldState",
            UpdateWorldStateRequest(actions=[MOVE, into_vault]),
            call("UpdateWorldState", "perception", plan_id="goal", step_id="apply"),
        )
    message = info.value.message
    assert "plan 'goal/apply' step 'check' failed (logic)" in message
    assert "action 2 move(mira, courtyard, vault): precondition at(mira, courtyard)" in message
    assert "\n" not in message
    assert agent.world.holds(r("mira", "at", "courtyard"))


async def test_extraction_plan_is_typed_and_uses_only_perception_tools() -> None:
    agent = PerceptionAgent()
    await extract(agent, "Mira waits in the courtyard.")
    [snapshot] = agent.plans("")
    plan = PerceptionPlan.model_validate_json(snapshot.plan_json)
    assert plan.extraction_patterns == list(DEFAULT_PATTERNS)
    assert plan.entity_resolution_strategy == "head_noun"
    assert [u.operation for u in plan.state_update_sequence] == ["merge"]
    assert {s.tool for s in plan.steps if s.kind == "tool"} <= set(agent.registry)
    assert all(s.status == "succeeded" for s in plan.steps)


async def test_the_world_survives_a_restart_through_its_store(tmp_path: Path) -> None:
    store = FileWorldStore(tmp_path / "perception.world.json")
    agent = PerceptionAgent(world_store=store)
    await extract(agent, load_goal("crown").passage)
    await agent.handle(
        "UpdateWorldState",
        UpdateWorldStateRequest(actions=[MOVE]),
        call("UpdateWorldState", "perception"),
    )
    facts, version = agent.world.facts(), agent.world.version
    assert len(facts) >= 10
    assert version == 2
    # The agent's process dies; a new one reads the world back, as it was after the last change.
    again = PerceptionAgent(world_store=FileWorldStore(tmp_path / "perception.world.json"))
    assert again.world.facts() == facts
    assert again.world.version == version
    assert again.world.holds(r("mira", "at", "garden"))
    assert dict(again.world.entities) == dict(agent.world.entities)
    assert oct((tmp_path / "perception.world.json").stat().st_mode & 0o777) == oct(0o600)


async def test_a_failed_change_saves_nothing_and_a_read_saves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "perception.world.json"
    agent = PerceptionAgent(world_store=FileWorldStore(path))
    await extract(agent, load_goal("crown").passage)
    saved = path.read_bytes()
    with pytest.raises(FailedPreconditionError):
        await agent.handle(
            "UpdateWorldState",
            UpdateWorldStateRequest(
                actions=[
                    Action(
                        name="move",
                        args=["mira", "courtyard", "vault"],
                        preconditions=[r("mira", "at", "vault")],
                        adds=[r("mira", "at", "vault")],
                        deletes=[r("mira", "at", "courtyard")],
                    )
                ]
            ),
            call("UpdateWorldState", "perception"),
        )
    await agent.handle(
        "FindSpatialContext",
        FindSpatialContextRequest(entity_ids=["mira"]),
        call("FindSpatialContext", "perception"),
    )
    assert path.read_bytes() == saved


async def test_a_passage_read_as_nothing_is_an_empty_answer_unless_facts_are_required() -> None:
    agent = PerceptionAgent()
    prose = "Lena Park, a tired detective, found the body in the library."
    answer = await extract(agent, prose)
    assert (answer.entities, answer.relations) == ([], [])
    with pytest.raises(FailedPreconditionError) as caught:
        await agent.handle(
            "ExtractEntities",
            ExtractEntitiesRequest(text=prose, require_facts=True),
            call("ExtractEntities", "perception"),
        )
    message = caught.value.message
    assert "step 'match' failed (logic): no sentence of the passage states a fact" in message
    for form in ("'Mira waits in the courtyard.'", "'The vault is locked.'", "docs/goals.md"):
        assert form in message
    assert 'STRATAGEM_PLANNERS=\'{"perception": "model"}\'' in message
