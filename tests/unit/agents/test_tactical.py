"""The tactical agent: goal-directed search, verified by re-simulation, clear no-solution errors."""

from __future__ import annotations

import pytest

from stratagem.agents import TacticalAgent, TacticalPlan
from stratagem.agents._actions import actors_for, ground_actions, search, simulate
from stratagem.protocol import (
    Beat,
    FailedPreconditionError,
    PlanExecutionSequenceRequest,
    PlanExecutionSequenceResponse,
    Relation,
)
from tests.unit.agents.conftest import call


def r(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


FACTS = [
    r("mira", "at", "courtyard"),
    r("mira", "wants", "crown"),
    r("crown", "in", "vault"),
    r("vault", "locked", "vault"),
    r("key", "in", "garden"),
    r("key", "opens", "vault"),
    r("courtyard", "connected", "hall"),
    r("hall", "connected", "vault"),
    r("courtyard", "connected", "garden"),
    r("tom", "at", "hall"),
    r("tom", "has", "ring"),
]
MEANS = Beat(id="beat_1", title="The means", goals=[r("mira", "has", "key")])
THRESHOLD = Beat(id="beat_2", title="The threshold", goals=[r("mira", "at", "vault")])
PRIZE = Beat(id="beat_3", title="The prize", goals=[r("mira", "has", "crown")])


def names(actions: list[object]) -> list[str]:
    return [f"{a.name}({','.join(a.args)})" for a in actions]  # type: ignore[attr-defined]


async def plan_sequence(
    agent: TacticalAgent, beat: Beat, prior: list[Beat], max_depth: int = 12
) -> PlanExecutionSequenceResponse:
    answer = await agent.handle(
        "PlanExecutionSequence",
        PlanExecutionSequenceRequest(
            beat=beat, prior_beats=prior, facts=FACTS, max_depth=max_depth
        ),
        call("PlanExecutionSequence", "tactical"),
    )
    assert isinstance(answer, PlanExecutionSequenceResponse)
    return answer


async def test_cumulative_search_finds_a_shortest_valid_sequence() -> None:
    answer = await plan_sequence(TacticalAgent(), PRIZE, [MEANS, THRESHOLD])
    assert answer.beat_id == "beat_3"
    assert names(answer.actions) == [
        "move(mira,courtyard,garden)",
        "take(mira,key,garden)",
        "move(mira,garden,courtyard)",
        "move(mira,courtyard,hall)",
        "unlock(mira,hall,vault,key)",
        "move(mira,hall,vault)",
        "take(mira,crown,vault)",
    ]
    goals = [*MEANS.goals, *THRESHOLD.goals, *PRIZE.goals]
    simulation = simulate(FACTS, answer.actions, goals)
    assert simulation.ok, simulation
    assert answer.states_explored > 0


async def test_each_action_carries_its_preconditions_and_effects() -> None:
    answer = await plan_sequence(TacticalAgent(), THRESHOLD, [MEANS])
    unlock = next(a for a in answer.actions if a.name == "unlock")
    assert unlock.preconditions == [
        r("mira", "at", "hall"),
        r("hall", "connected", "vault"),
        r("mira", "has", "key"),
        r("key", "opens", "vault"),
        r("vault", "locked", "vault"),
    ]
    assert unlock.adds == []
    assert unlock.deletes == [r("vault", "locked", "vault")]
    back = next(a for a in answer.actions if a.args == ["mira", "garden", "courtyard"])
    # connected is symmetric; the precondition names the fact as the world stores it.
    assert r("courtyard", "connected", "garden") in back.preconditions


def test_search_is_deterministic_and_respects_locks() -> None:
    goals = [r("mira", "at", "vault")]
    first = search(FACTS, goals, max_depth=12)
    second = search(FACTS, goals, max_depth=12)
    assert first == second
    assert first.actions is not None
    assert "unlock" in [a.name for a in first.actions]


def test_other_characters_only_hand_over_what_they_hold() -> None:
    assert actors_for(FACTS, [r("mira", "has", "ring")]) == ["mira"]
    outcome = search(FACTS, [r("mira", "has", "ring")], max_depth=6)
    assert outcome.actions is not None
    assert names(outcome.actions) == ["move(mira,courtyard,hall)", "give(tom,ring,mira,hall)"]
    moves = {a.action.args[0] for a in ground_actions(FACTS, ["mira"]) if a.action.name == "move"}
    assert moves == {"mira"}


def test_simulate_reports_the_first_broken_action() -> None:
    outcome = search(FACTS, [r("mira", "has", "key")], max_depth=4)
    assert outcome.actions is not None
    broken = simulate(FACTS, list(reversed(outcome.actions)), [r("mira", "has", "key")])
    assert not broken.ok
    assert broken.error == (
        "action 1 take(mira, key, garden): precondition at(mira, garden) does not hold"
    )


async def test_no_solution_within_depth_is_a_clear_failure() -> None:
    with pytest.raises(FailedPreconditionError) as info:
        await plan_sequence(TacticalAgent(), PRIZE, [MEANS, THRESHOLD], max_depth=3)
    message = info.value.message
    assert "step 'search' failed (logic)" in message
    assert (
        "no action sequence reaches has(mira, key), at(mira, vault), has(mira, crown) "
        "within 3 steps"
    ) in message


async def test_unreachable_goal_and_node_cap_are_clear_failures() -> None:
    stranded = Beat(id="beat_1", title="Stranded", goals=[r("mira", "at", "moon")])
    with pytest.raises(FailedPreconditionError, match=r"reaches at\(mira, moon\) within 12 steps"):
        await plan_sequence(TacticalAgent(), stranded, [])
    # An exhausted node cap is replanned once with 4x the cap (2 -> 8), which is still too few.
    with pytest.raises(FailedPreconditionError, match=r"within 8 states"):
        await plan_sequence(TacticalAgent(node_cap=2), PRIZE, [MEANS, THRESHOLD])


async def test_an_exhausted_search_is_replanned_with_a_larger_node_cap() -> None:
    agent = TacticalAgent(node_cap=4)  # the search needs 13 states; a replan gives it 16
    answer = await plan_sequence(agent, PRIZE, [MEANS, THRESHOLD])
    assert len(answer.actions) == 7
    [snapshot] = agent.plans("")
    plan = TacticalPlan.model_validate_json(snapshot.plan_json)
    assert (snapshot.revision, snapshot.status) == (2, "succeeded")
    assert plan.resource_requirements.node_cap == 16
    assert next(s for s in plan.steps if s.id == "search").input["node_cap"] == 16


async def test_the_callers_depth_is_never_exceeded_by_a_replan() -> None:
    agent = TacticalAgent()
    with pytest.raises(FailedPreconditionError, match="within 3 steps"):
        await plan_sequence(agent, PRIZE, [MEANS, THRESHOLD], max_depth=3)
    [snapshot] = agent.plans("")
    assert snapshot.revision == 1


async def test_tactical_plan_is_typed() -> None:
    agent = TacticalAgent()
    await plan_sequence(agent, THRESHOLD, [MEANS])
    [snapshot] = agent.plans("")
    plan = TacticalPlan.model_validate_json(snapshot.plan_json)
    assert [s.step for s in plan.execution_steps] == ["ground", "search", "verify"]
    assert plan.dependencies == {"ground": [], "search": ["ground"], "verify": ["search"]}
    needs = plan.resource_requirements
    assert needs.actors == ["mira"]
    assert needs.goals == [r("mira", "has", "key"), r("mira", "at", "vault")]
    assert needs.max_depth == 12
