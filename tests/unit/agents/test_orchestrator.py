"""SubmitGoal end to end in one process: the four agents wired through an InMemoryDispatcher."""

from __future__ import annotations

import asyncio

import pytest

from stratagem.agents import DEMO_GOAL, Agent, OrchestrationPlan, PerceptionAgent
from stratagem.agents._actions import simulate
from stratagem.planning import CrossAgentStep, InMemoryDispatcher, Plan, ToolStep, validate_plan
from stratagem.protocol import (
    FailedPreconditionError,
    PlanEvent,
    SubmitGoalRequest,
    SubmitGoalResponse,
    UpdateWorldStateRequest,
    WireModel,
)
from tests.unit.agents.conftest import EXAMPLE_NAMES, call, load_goal

Cluster = tuple[dict[str, Agent], InMemoryDispatcher]


async def submit(agents: dict[str, Agent], request: SubmitGoalRequest) -> SubmitGoalResponse:
    answer = await agents["orchestrator"].handle(
        "SubmitGoal", request, call("SubmitGoal", "orchestrator")
    )
    assert isinstance(answer, SubmitGoalResponse)
    return answer


def test_the_demo_goal_is_the_crown_example() -> None:
    assert load_goal("crown") == DEMO_GOAL


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
async def test_every_example_goal_is_reached(name: str, cluster: Cluster) -> None:
    agents, dispatcher = cluster
    perception = agents["perception"]
    assert isinstance(perception, PerceptionAgent)
    goal = load_goal(name).model_copy(update={"plan_id": f"goal-{name}"})

    answer = await submit(agents, goal)

    assert answer.plan_id == f"goal-{name}"
    assert answer.status == "succeeded"
    assert [b.id for b in answer.beats] == [f"beat_{i}" for i in range(1, goal.beats + 1)]
    assert answer.actions
    # A goal naming no world gets a fresh one, named after its plan; the default one is untouched.
    assert answer.world == f"goal-{name}"
    world = perception.worlds.get(answer.world)
    assert perception.world.facts() == []
    # The sequence re-simulates cleanly from the facts the passage stated ...
    opening = [*answer.removed, *(f for f in world.facts() if f not in answer.added)]
    every_goal = [g for beat in answer.beats for g in beat.goals]
    assert simulate(opening, answer.actions, every_goal).ok
    # ... and every beat's goals hold in the world the perception agent now has.
    for fact in every_goal:
        assert world.holds(fact), fact
    for fact in answer.added:
        assert world.holds(fact)
    for fact in answer.removed:
        assert not world.holds(fact)

    # Who was asked what, in an order the dependencies allow.
    asked = [(c.target, c.capability, c.step_id) for c in dispatcher.calls]
    assert asked[0] == ("perception", "ExtractEntities", "extract")
    # The world changed, then read back to confirm the goal holds (checked, not assumed).
    assert asked[-2:] == [
        ("perception", "UpdateWorldState", "apply"),
        ("perception", "FindSpatialContext", "observe"),
    ]
    assert {c.caller for c in dispatcher.calls} == {"orchestrator"}
    assert sum(1 for t, _, _ in asked if t == "tactical") == goal.beats


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
async def test_every_plan_names_only_its_own_agents_tools(name: str, cluster: Cluster) -> None:
    agents, _ = cluster
    goal = load_goal(name).model_copy(update={"plan_id": f"goal-{name}"})
    await submit(agents, goal)
    for role, agent in agents.items():
        snapshots = agent.plans(goal.plan_id)
        assert snapshots, role
        for snapshot in snapshots:
            assert snapshot.plan_id == goal.plan_id or snapshot.plan_id.startswith(
                goal.plan_id + "/"
            )
            plan = agent.plan_type.model_validate_json(snapshot.plan_json)
            assert isinstance(plan, Plan)
            assert plan.owner == role
            validate_plan(plan, tools=agent.registry)
            tools = {s.tool for s in plan.steps if isinstance(s, ToolStep)}
            assert tools <= set(agent.registry), (role, tools)
            for other_role, other in agents.items():
                if other_role != role:
                    assert not tools & set(other.registry), (role, other_role)
    orchestration = agents["orchestrator"].plans(goal.plan_id)
    [plan] = [OrchestrationPlan.model_validate_json(s.plan_json) for s in orchestration]
    # Cross-agent steps, and one tool of its own that only reads: the confirmation.
    assert [s.id for s in plan.steps if not isinstance(s, CrossAgentStep)] == ["confirm"]
    assert [(a.step, a.agent) for a in plan.assignments][:4] == [
        ("extract", "perception"),
        ("spatial", "perception"),
        ("analyze", "strategic"),
        ("arc", "strategic"),
    ]
    assert [(a.step, a.agent) for a in plan.assignments][-2:] == [
        ("observe", "perception"),
        ("confirm", "orchestrator"),
    ]
    assert agents["orchestrator"].registry.names() == [
        "confirm_goal",
        "waive_consultation",
        "show_goal_plan",
    ]


async def test_watch_follows_the_goal_on_every_agent(cluster: Cluster) -> None:
    agents, _ = cluster
    goal = DEMO_GOAL.model_copy(update={"plan_id": "goal-watched"})
    seen: dict[str, list[PlanEvent]] = {role: [] for role in agents}

    async def follow(role: str) -> None:
        async for event in agents[role].watch("goal-watched"):
            seen[role].append(event)

    watchers = {role: asyncio.create_task(follow(role)) for role in agents}
    await asyncio.sleep(0)
    await submit(agents, goal)
    # The orchestrator owns the plan: its stream ends with the plan's final event.
    await asyncio.wait_for(watchers["orchestrator"], 1)
    last = seen["orchestrator"][-1]
    assert (last.plan_id, last.step_id, last.status) == ("goal-watched", "", "succeeded")
    # The others only hold sub-plans: their streams show them and go on until stopped.
    await asyncio.sleep(0.01)
    assert {e.plan_id for e in seen["tactical"]} == {
        "goal-watched/beat_1",
        "goal-watched/beat_2",
        "goal-watched/beat_3",
    }
    assert {e.plan_id for e in seen["perception"]} == {
        "goal-watched/extract",
        "goal-watched/spatial",
        "goal-watched/apply",
        "goal-watched/observe",
    }
    for role in ("perception", "strategic", "tactical"):
        assert not watchers[role].done()
        watchers[role].cancel()
    await asyncio.gather(*watchers.values(), return_exceptions=True)


async def test_a_goal_the_arc_cannot_serve_fails_naming_the_step(cluster: Cluster) -> None:
    agents, _ = cluster
    goal = SubmitGoalRequest(
        goal="Mira recovers the crown",
        passage="Mira waits in the courtyard. The crown rests in the vault. The vault is locked.",
        beats=3,
        plan_id="goal-keyless",
    )
    with pytest.raises(FailedPreconditionError) as info:
        await submit(agents, goal)
    message = info.value.message
    assert message.startswith("plan 'goal-keyless' step 'arc' failed (logic):")
    assert "the vault is locked and nothing in the world opens it" in message
    [snapshot] = agents["orchestrator"].plans("goal-keyless")
    assert snapshot.status == "failed"


async def test_an_unreachable_key_fails_the_first_beat_and_changes_nothing(
    cluster: Cluster,
) -> None:
    agents, _ = cluster
    perception = agents["perception"]
    assert isinstance(perception, PerceptionAgent)
    goal = SubmitGoalRequest(
        goal="Mira recovers the crown",
        passage=(
            "Mira waits in the courtyard. The crown rests in the vault. The vault is locked. "
            "The iron key lies in the tower. The iron key opens the vault. "
            "The courtyard leads to the vault."
        ),
        beats=2,
        plan_id="goal-stuck",
    )
    with pytest.raises(FailedPreconditionError) as info:
        await submit(agents, goal)
    assert "step 'beat_1' failed (logic)" in info.value.message
    assert "no action sequence reaches has(mira, iron_key)" in info.value.message
    version = perception.worlds.get("goal-stuck").version
    assert version == 1  # only the extraction merged; nothing was applied
    statuses = {s.plan_id: s.status for s in perception.plans("goal-stuck")}
    assert "goal-stuck/apply" not in statuses


async def test_a_passage_that_yields_no_entity_fails_in_words(cluster: Cluster) -> None:
    agents, _ = cluster
    goal = SubmitGoalRequest(
        goal="Lena Park solves the murder",
        passage="Lena Park, a tired detective, found the body in the library.",
        beats=2,
    )
    with pytest.raises(FailedPreconditionError) as caught:
        await submit(agents, goal)
    message = str(caught.value)
    assert "step 'extract' failed (logic)" in message
    # The sentence forms the deterministic extractor reads, and how to attach a model instead.
    assert "no sentence of the passage states a fact the extractor reads" in message
    assert "'Mira waits in the courtyard.'" in message
    assert 'STRATAGEM_PLANNERS=\'{"perception": "model"}\'' in message
    assert "List should have at least 1 item" not in message


async def test_a_passage_of_several_paragraphs_is_extracted_by_a_map(cluster: Cluster) -> None:
    agents, _ = cluster
    perception = agents["perception"]
    assert isinstance(perception, PerceptionAgent)
    crown = load_goal("crown")
    sentences = crown.passage.split(". ")
    # The same story, one paragraph a few sentences long each.
    passage = "\n\n".join(". ".join(sentences[i : i + 3]) for i in range(0, len(sentences), 3))
    goal = crown.model_copy(update={"plan_id": "goal-paragraphs", "passage": passage})
    answer = await submit(agents, goal)
    assert answer.status == "succeeded"
    plan = agents["orchestrator"].record("goal-paragraphs").plan
    assert isinstance(plan, OrchestrationPlan)
    extract = plan.step("extract")
    assert extract.kind == "map"
    assert plan.inputs["paragraphs"] == [" ".join(p.split()) for p in passage.split("\n\n")]
    assert [(a.step, a.agent) for a in plan.assignments][:3] == [
        ("extract", "perception"),
        ("spatial", "perception"),
        ("analyze", "strategic"),
    ]
    validate_plan(plan, tools=agents["orchestrator"].registry)
    # Each paragraph was a request of its own (and a plan of the perception agent's), merged
    # into the goal's world; the goal was confirmed there.
    extracted = [s.plan_id for s in perception.plans("goal-paragraphs") if "extract." in s.plan_id]
    assert len(extracted) == len(plan.inputs["paragraphs"]) > 1
    world = perception.worlds.get(answer.world)
    for fact in (g for beat in answer.beats for g in beat.goals):
        assert world.holds(fact), fact


async def test_a_goal_succeeds_only_when_it_holds_in_the_world_afterwards(
    cluster: Cluster,
) -> None:
    agents, dispatcher = cluster
    perception = agents["perception"]

    async def applies_nothing(request: WireModel) -> WireModel:
        # A perception agent that answers as if it applied the actions, and changes nothing.
        assert isinstance(request, UpdateWorldStateRequest)
        dry = request.model_copy(update={"dry_run": True})
        return await perception.handle("UpdateWorldState", dry, call("UpdateWorldState", "x"))

    dispatcher.register("perception", "UpdateWorldState", applies_nothing)
    goal = DEMO_GOAL.model_copy(update={"plan_id": "goal-unconfirmed"})
    with pytest.raises(FailedPreconditionError) as info:
        await submit(agents, goal)
    message = info.value.message
    assert message.startswith("plan 'goal-unconfirmed' step 'confirm' failed (logic):")
    assert "has(mira, silver_crown)" in message
    assert "the goal does not hold in the world afterwards" in message
    [snapshot] = agents["orchestrator"].plans("goal-unconfirmed")
    assert snapshot.status == "failed"
