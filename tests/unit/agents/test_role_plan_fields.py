"""A role plan's typed fields (``TacticalPlan.dependencies``, ``PerceptionPlan.
extraction_patterns``, ...) record what the role's planner decided; nothing runs them in a plan a
user submits, so a user's plan that sets one is refused, naming the field (issue 32: they were
accepted and ignored, ``dependencies: {zzz: [nope]}`` passed).

The table below has a value for every field each role's plan type adds to ``Plan``: a field added
later and not listed fails ``test_the_table_covers_every_role_field``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import (
    OrchestrationPlan,
    OrchestratorAgent,
    PerceptionAgent,
    PerceptionPlan,
    RoleAgent,
    StrategicAgent,
    StrategicPlan,
    TacticalAgent,
    TacticalPlan,
)
from stratagem.planning import Plan, PlanStatus, SqliteStateStore
from stratagem.protocol import InvalidArgumentError

ROLES: dict[str, tuple[type[RoleAgent], type[Plan], str]] = {
    "strategic": (StrategicAgent, StrategicPlan, "measure_tension"),
    "tactical": (TacticalAgent, TacticalPlan, "decompose_goal"),
    "perception": (PerceptionAgent, PerceptionPlan, "split_sentences"),
    "orchestrator": (OrchestratorAgent, OrchestrationPlan, "confirm_goal"),
}

# role -> field -> a value other than the default, as a user's plan could give it.
SET: dict[str, dict[str, Any]] = {
    "strategic": {
        "narrative_goals": [{"text": "reach the crown"}],
        "thematic_elements": ["power"],
        "dramatic_beats": [{"id": "b1", "index": 1}],
    },
    "tactical": {
        "execution_steps": [{"step": "zzz", "purpose": "nothing"}],
        "dependencies": {"zzz": ["nope"]},
        "resource_requirements": {"max_depth": 3},
    },
    "perception": {
        "extraction_patterns": [
            {
                "name": "owns",
                "regex": "(?P<s>\\w+) owns (?P<o>\\w+)",
                "predicate": "has",
                "subject_kind": "character",
                "object_kind": "object",
            }
        ],
        "entity_resolution_strategy": "exact",
        "state_update_sequence": [{"step": "zzz", "operation": "merge"}],
    },
    "orchestrator": {
        "assignments": [{"step": "zzz", "agent": "nobody", "capability": "Nothing"}],
    },
}


def role_fields(plan_type: type[Plan]) -> set[str]:
    return set(plan_type.model_fields) - set(Plan.model_fields)


@pytest.mark.parametrize("role", sorted(ROLES))
def test_the_table_covers_every_role_field(role: str) -> None:
    """Every field a role's plan type adds is the planner's (refused in a user's plan), and the
    table below has a value for it."""
    plan_type = ROLES[role][1]
    assert plan_type.planner_fields == role_fields(plan_type)
    assert set(SET[role]) == role_fields(plan_type)


def users_plan(role: str, **fields: Any) -> dict[str, Any]:
    return {"id": f"mine-{role}", "owner": role, "goal": "a user's plan", **fields}


@pytest.mark.parametrize(
    ("role", "field"), [(role, field) for role in sorted(SET) for field in sorted(SET[role])]
)
async def test_a_users_plan_setting_a_role_field_is_refused_naming_it(
    role: str, field: str
) -> None:
    agent_type, plan_type, _ = ROLES[role]
    raw = users_plan(role, **{field: SET[role][field]})
    assert getattr(plan_type.model_validate(raw), field) != plan_type.model_fields[
        field
    ].get_default(call_default_factory=True)  # the value is accepted by the model...
    with pytest.raises(InvalidArgumentError) as info:
        await agent_type().submit_plan(raw)  # ... and refused by the agent
    assert info.value.message == (
        f"plan 'mine-{role}' refused: field {field!r} is set by the {role} agent's planner and "
        f"nothing runs it in a user's plan: leave it out (the steps say what runs)"
    )


@pytest.mark.parametrize("role", sorted(ROLES))
async def test_a_users_plan_with_the_defaults_still_runs(role: str) -> None:
    """An exported plan carries the fields at their defaults: nothing asked, nothing refused."""
    agent_type, plan_type, _ = ROLES[role]
    defaults = {
        name: plan_type.model_fields[name].get_default(call_default_factory=True)
        for name in role_fields(plan_type)
    }
    plan = plan_type.model_validate(users_plan(role, **defaults))
    result = await agent_type().submit_plan(plan.model_dump(mode="json"))
    assert result.status is PlanStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("role", "field"), [(role, field) for role in sorted(SET) for field in sorted(SET[role])]
)
async def test_a_replan_setting_a_role_field_is_refused_naming_it(
    role: str, field: str, tmp_path: Path
) -> None:
    """``replan`` takes a user's plan too: a planner's field it sets is refused as ``plans run``
    refuses it (before, the new revision was stored with it, and nothing ran it)."""
    agent_type, plan_type, _ = ROLES[role]
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as store:
        agent = agent_type(store=store)
        plan_id = f"mine-{role}"
        await agent.submit_plan(users_plan(role))
        first = await agent.revisions(plan_id)
        raw = users_plan(role, **{field: SET[role][field]})
        with pytest.raises(InvalidArgumentError) as info:
            await agent.replan(plan_id, json.dumps(raw), rationale="r", author="operator")
        assert info.value.message == (
            f"replan of {plan_id!r} refused: field {field!r} is set by the {role} agent's "
            f"planner and nothing runs it in a user's plan: leave it out (the steps say what runs)"
        )
        assert len((await agent.revisions(plan_id)).revisions) == len(first.revisions)
        # The plan as exported (the fields at the revision's values) is a replan as before.
        kept = plan_type.model_validate(users_plan(role)).model_dump(mode="json")
        snapshot = await agent.replan(plan_id, json.dumps(kept), rationale="r", author="operator")
        assert snapshot.revision == first.revisions[-1].revision + 1
        await agent.aclose()


def test_a_replan_keeping_the_revisions_own_planner_values_passes() -> None:
    """A planner's plan exported and given back by ``replan`` carries the planner's values:
    nothing new is asked, nothing refused (a changed value is)."""
    from stratagem.agents._admission import planner_fields_set

    planned = TacticalPlan.model_validate(users_plan("tactical", **SET["tactical"]))
    assert len(planner_fields_set(planned, TacticalPlan)) == len(SET["tactical"])
    assert planner_fields_set(planned, TacticalPlan, replacing=planned) == []
    changed = planned.model_copy(update={"dependencies": {"zzz": ["other"]}})
    (problem,) = planner_fields_set(changed, TacticalPlan, replacing=planned)
    assert problem.startswith("field 'dependencies' is set by the tactical agent's planner")
