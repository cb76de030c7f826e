"""Worlds a goal names: every perception request acts on one named world, a goal that names none
gets a fresh one, worlds are listed, shown and reset, kept across restarts, and a goal whose arc
held before any action says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stratagem.agents import Agent, FileWorldStore, PerceptionAgent, build_in_memory
from stratagem.planning import InMemoryDispatcher
from stratagem.protocol import (
    ALREADY_HOLDS,
    ExtractEntitiesRequest,
    FailedPreconditionError,
    ListWorldsRequest,
    ListWorldsResponse,
    ResetWorldRequest,
    ResetWorldResponse,
    ShowWorldRequest,
    ShowWorldResponse,
    SubmitGoalRequest,
    SubmitGoalResponse,
    WireModel,
)
from tests.unit.agents.conftest import call
from tests.unit.agents.test_perception import r

Cluster = tuple[dict[str, Agent], InMemoryDispatcher]

# A passage that teaches the map and one that only places Mira: the second goal, run in the
# world the first one taught, is reached; in a world of its own it cannot be.
MAP = (
    "Mira waits in the courtyard. The courtyard leads to the garden. "
    "The silver crown lies in the garden."
)
ONLY_MIRA = "Mira waits in the courtyard. Mira wants the silver crown."


async def _ask(agent: Agent, capability: str, request: WireModel) -> WireModel:
    return await agent.handle(capability, request, call(capability, agent.role))


async def _submit(agents: dict[str, Agent], **goal: object) -> SubmitGoalResponse:
    request = SubmitGoalRequest.model_validate({"beats": 1, **goal})
    answer = await _ask(agents["orchestrator"], "SubmitGoal", request)
    assert isinstance(answer, SubmitGoalResponse)
    return answer


def _perception(agents: dict[str, Agent]) -> PerceptionAgent:
    perception = agents["perception"]
    assert isinstance(perception, PerceptionAgent)
    return perception


async def test_earlier_goals_do_not_decide_a_goal_that_names_no_world(cluster: Cluster) -> None:
    agents, _ = cluster
    taught = await _submit(
        agents, goal="Mira recovers the silver crown", passage=MAP, plan_id="goal-map"
    )
    assert (taught.status, taught.world) == ("succeeded", "goal-map")
    # Unchanged, in a fresh world: the map is not there, so the goal is not reached.
    with pytest.raises(FailedPreconditionError):
        await _submit(agents, goal="Mira recovers the silver crown", passage=ONLY_MIRA)
    perception = _perception(agents)
    assert perception.worlds.get("goal-map").holds(r("mira", "has", "silver_crown"))
    assert perception.world.facts() == []  # the default world saw none of it


async def test_a_goal_naming_a_world_reads_and_changes_that_world(cluster: Cluster) -> None:
    agents, _ = cluster
    await _ask(
        agents["perception"], "ExtractEntities", ExtractEntitiesRequest(text=MAP, world="tale")
    )
    answer = await _submit(
        agents, goal="Mira recovers the silver crown", passage=ONLY_MIRA, world="tale"
    )
    assert (answer.status, answer.world) == ("succeeded", "tale")
    assert [a.name for a in answer.actions] == ["move", "take"]
    tale = _perception(agents).worlds.get("tale")
    assert tale.holds(r("mira", "has", "silver_crown"))


async def test_a_goal_that_already_holds_says_so(cluster: Cluster) -> None:
    agents, _ = cluster
    answer = await _submit(
        agents,
        goal="Mira recovers the silver crown",
        passage="Mira waits in the courtyard. Mira has the silver crown.",
        plan_id="goal-held",
    )
    assert answer.status == ALREADY_HOLDS
    assert answer.actions == []
    assert answer.note == (
        "the goal already holds in world 'goal-held' before any action "
        "(at(mira, courtyard), has(mira, silver_crown)): nothing was done"
    )
    # The plan itself ran to its end: only the answer tells the goal apart from a change.
    [plan] = agents["orchestrator"].plans("goal-held")[:1]
    assert plan.status == "succeeded"


async def test_worlds_are_listed_shown_and_reset(cluster: Cluster) -> None:
    agents, _ = cluster
    perception = agents["perception"]
    await _submit(agents, goal="Mira recovers the silver crown", passage=MAP, plan_id="goal-a")
    await _ask(perception, "ExtractEntities", ExtractEntitiesRequest(text="Tom waits in the hut."))
    listed = await _ask(perception, "ListWorlds", ListWorldsRequest())
    assert isinstance(listed, ListWorldsResponse)
    assert [(w.name, w.entities, w.facts) for w in listed.worlds] == [
        ("default", 2, 1),
        ("goal-a", 4, 3),
    ]
    assert listed.total == 2
    only = await _ask(perception, "ListWorlds", ListWorldsRequest(prefix="goal-"))
    assert isinstance(only, ListWorldsResponse)
    assert [w.name for w in only.worlds] == ["goal-a"]

    shown = await _ask(perception, "ShowWorld", ShowWorldRequest(world="goal-a"))
    assert isinstance(shown, ShowWorldResponse)
    assert r("mira", "has", "silver_crown") in shown.facts
    assert {e.id for e in shown.entities} == {"mira", "courtyard", "garden", "silver_crown"}

    reset = await _ask(perception, "ResetWorld", ResetWorldRequest(world="goal-a"))
    assert isinstance(reset, ResetWorldResponse)
    assert (reset.entities_removed, reset.facts_removed) == (4, 3)
    assert reset.version == shown.version + 1
    emptied = await _ask(perception, "ShowWorld", ShowWorldRequest(world="goal-a"))
    assert isinstance(emptied, ShowWorldResponse)
    assert (emptied.entities, emptied.facts, emptied.version) == ([], [], reset.version)
    # Another world was left alone.
    assert _perception(agents).world.holds(r("tom", "at", "hut"))


async def test_an_unknown_world_is_named_with_the_worlds_there_are(cluster: Cluster) -> None:
    agents, _ = cluster
    perception = agents["perception"]
    await _ask(perception, "ExtractEntities", ExtractEntitiesRequest(text=MAP, world="tale"))
    for capability, request in (
        ("ShowWorld", ShowWorldRequest(world="tail")),
        ("ResetWorld", ResetWorldRequest(world="tail")),
    ):
        with pytest.raises(FailedPreconditionError) as caught:
            await _ask(perception, capability, request)
        assert "no world 'tail'; worlds: tale ('stratagem world list')" in str(caught.value)


def test_a_world_name_is_a_lowercase_slug() -> None:
    with pytest.raises(ValueError, match="world"):
        SubmitGoalRequest(goal="g", passage="p", world="My World")
    with pytest.raises(ValueError, match="world"):
        ShowWorldRequest(world="")
    with pytest.raises(ValueError, match="world"):
        ExtractEntitiesRequest(text="t", world="../etc")
    assert SubmitGoalRequest(goal="g", passage="p", world="tale-2.b_c").world == "tale-2.b_c"


async def test_worlds_survive_a_restart_each_in_its_own_file(tmp_path: Path) -> None:
    path = tmp_path / "perception.world.json"
    agent = PerceptionAgent(world_store=FileWorldStore(path))
    await _ask(agent, "ExtractEntities", ExtractEntitiesRequest(text=MAP, world="tale"))
    await _ask(agent, "ExtractEntities", ExtractEntitiesRequest(text="Tom waits in the hut."))
    await _ask(agent, "ResetWorld", ResetWorldRequest(world="default"))
    assert sorted(p.name for p in (tmp_path / "perception.worlds").iterdir()) == ["tale.json"]
    assert json.loads(path.read_text())["facts"] == []  # the default world, where it always was

    again = PerceptionAgent(world_store=FileWorldStore(path))
    assert again.worlds.names() == ["default", "tale"]
    assert again.worlds.get("tale").holds(r("mira", "at", "courtyard"))
    assert again.world.facts() == []
    assert again.world.version == 2  # merged once, then reset
    assert oct((tmp_path / "perception.worlds" / "tale.json").stat().st_mode & 0o777) == "0o600"


def test_a_goal_with_no_world_gets_one_named_after_its_plan() -> None:
    from stratagem.agents._orchestrator import goal_world

    goal = SubmitGoalRequest(goal="g", passage="p")
    assert goal_world(goal, "goal-3fd8b841aa9e") == "goal-3fd8b841aa9e"
    assert goal_world(goal, "My:Plan/1") == "my-plan-1"
    assert goal_world(goal, "A" * 200) == "a" * 64
    assert goal_world(goal.model_copy(update={"world": "tale"}), "goal-1") == "tale"


@pytest.fixture
def cluster() -> Cluster:
    return build_in_memory(entry_points=False)
