"""Plan models: fields, constraints, the step union and subclassing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stratagem.planning import (
    CrossAgentStep,
    FailureClass,
    Plan,
    PlanStatus,
    RetryPolicy,
    StepStatus,
    ToolStep,
)


def test_retry_policy_defaults() -> None:
    policy = RetryPolicy()
    assert (
        policy.max_attempts,
        policy.initial_backoff_s,
        policy.max_backoff_s,
        policy.multiplier,
        policy.jitter,
    ) == (3, 0.05, 2.0, 2.0, 0.2)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_backoff_s": -0.1}, "initial_backoff_s"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_retry_policy_rejects_out_of_range(fields: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        RetryPolicy(**fields)
    assert info.value.errors()[0]["loc"] == (field,)


def test_retry_policy_cap_below_start_is_rejected() -> None:
    with pytest.raises(ValidationError, match="max_backoff_s must not be less than"):
        RetryPolicy(initial_backoff_s=1.0, max_backoff_s=0.5)


def test_steps_parse_as_a_union_discriminated_on_kind() -> None:
    plan = Plan.model_validate(
        {
            "id": "p1",
            "owner": "orchestrator",
            "goal": "g",
            "steps": [
                {"kind": "tool", "id": "a", "tool": "read", "input": {"x": 1}},
                {
                    "kind": "cross_agent",
                    "id": "b",
                    "depends_on": ["a"],
                    "target": "perception",
                    "capability": "ExtractEntities",
                    "request": {"text": {"$ref": "a.x"}},
                },
            ],
        }
    )
    first, second = plan.steps
    assert isinstance(first, ToolStep)
    assert first.input == {"x": 1}
    assert isinstance(second, CrossAgentStep)
    assert second.target == "perception"
    assert second.status is StepStatus.PENDING
    assert second.retry == RetryPolicy()


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValidationError, match="gate"):
        Plan.model_validate(
            {"id": "p1", "owner": "strategic", "goal": "g", "steps": [{"kind": "gate", "id": "a"}]}
        )


@pytest.mark.parametrize("step_id", ["A", "1a", "a.b", "a[0]", "", "a" * 65])
def test_step_ids_are_slugs(step_id: str) -> None:
    with pytest.raises(ValidationError):
        ToolStep(id=step_id, tool="t")


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        ToolStep(id="a", tool="t", timeout_s=0)


def test_plans_and_steps_are_frozen_and_strict() -> None:
    step = ToolStep(id="a", tool="t")
    with pytest.raises(ValidationError):
        step.tool = "u"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        ToolStep(id="a", tool="t", surprise=1)  # type: ignore[call-arg]


def test_plan_round_trips_through_json() -> None:
    plan = Plan(
        id="story-1:turn/2",
        revision=2,
        owner="strategic",
        goal="arc",
        steps=[ToolStep(id="a", tool="t", timeout_s=1.5, retry=RetryPolicy(max_attempts=5))],
        max_in_flight=2,
    )
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again == plan
    assert plan.model_dump(mode="json")["steps"][0]["status"] == "pending"
    assert plan.step("a").timeout_s == 1.5
    with pytest.raises(KeyError):
        plan.step("zz")


def test_plan_is_subclassable_with_typed_fields() -> None:
    class StoryPlan(Plan):
        themes: list[str]

    plan = StoryPlan(id="p", owner="strategic", goal="g", themes=["loss"], steps=[])
    assert plan.themes == ["loss"]
    assert StoryPlan.model_validate_json(plan.model_dump_json()) == plan


def test_status_and_class_values() -> None:
    assert [s.value for s in StepStatus] == [
        "pending",
        "running",
        "retrying",
        "succeeded",
        "failed",
        "skipped",
        "cancelled",
        "blocked",
        "compensating",
        "compensated",
        "compensation_failed",
    ]
    assert [s.value for s in PlanStatus] == [
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "blocked",
        "paused",
        "compensating",
    ]
    assert {c.value for c in FailureClass} == {
        "transient",
        "logic",
        "policy",
        "timeout",
        "cancelled",
    }
