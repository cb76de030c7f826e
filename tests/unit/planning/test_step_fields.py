"""Every field a step kind accepts is honoured or refused at validation (issue 32).

``EVIDENCE`` maps each (kind, field) of the ``Step`` union's models to the behaviour test that
proves the engine reads it (``(module, test)``), or to ``Refused`` (a value that validation
refuses, in one line naming the step and the field). A field added to a step model and not in
the table fails ``test_the_table_covers_every_field_of_every_step_kind``; a named test that does
not exist fails ``test_each_named_test_exists``. The fields shared by every kind (``StepBase``) are
read by the one scheduler, condition and compensation code for every kind, so one test proves them
for each kind that does not refuse them.
"""

from __future__ import annotations

import asyncio
import importlib
import typing
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from stratagem.planning import (
    Engine,
    Plan,
    PlanStatus,
    PlanValidationError,
    Step,
    StepStatus,
    ToolContext,
    validate_plan,
)

from ._support import DictToolRunner, noop


@dataclass(frozen=True)
class Refused:
    """Validation refuses ``value`` for the field, naming the step and the field."""

    value: Any
    words: str  # the field as the refusal names it


Test = tuple[str, str]  # (module, test) under tests/unit/planning

ENGINE = "test_engine"
DYNAMIC = "test_dynamic"
GATES = "test_gates"
HONOURED = "test_nested_honoured"
HERE = "test_step_fields"

# Read by the one scheduler (depends_on, when, runs_on, priority) for every kind.
SHARED: dict[str, Test] = {
    "kind": ("test_plan", "test_steps_parse_as_a_union_discriminated_on_kind"),
    "id": ("test_validate", "test_duplicate_ids"),
    "title": (HERE, "test_a_title_is_carried_with_the_plan_for_people"),
    "status": (HERE, "test_a_submitted_status_is_the_engines_to_set"),
    "depends_on": (ENGINE, "test_dependents_start_only_after_their_dependencies"),
    "when": ("test_conditions", "test_a_false_condition_skips_the_step_and_what_needs_it"),
    "runs_on": ("test_conditions", "test_a_route_on_failure_runs_when_its_dependency_failed"),
    "priority": (DYNAMIC, "test_higher_priority_ready_steps_start_first_under_the_bound"),
}
ATTEMPTED: dict[str, Test] = {
    "timeout_s": (ENGINE, "test_timeout_fires_is_retried_then_fails"),
    "retry": (
        "test_failure_policy",
        "test_transient_and_timeout_failures_retry_until_the_attempts_run_out",
    ),
    "compensate": ("test_durable", "test_a_failed_plan_is_compensated_in_reverse_order"),
    "compensate_input": ("test_durable", "test_a_failed_plan_is_compensated_in_reverse_order"),
    "on_policy_failure": (
        "test_failure_policy",
        "test_a_policy_failure_is_held_at_a_gate_when_the_step_asks_for_one",
    ),
}
NO_COMPENSATION = {
    "compensate": Refused("undo", "compensation"),
    "compensate_input": Refused({"x": 1}, "compensation"),
    "on_policy_failure": Refused("gate", "on_policy_failure"),
}

EVIDENCE: dict[str, dict[str, Test | Refused]] = {
    "tool": {
        **SHARED,
        **ATTEMPTED,
        "tool": (ENGINE, "test_tool_inputs_resolve_references"),
        "input": (ENGINE, "test_tool_inputs_resolve_references"),
    },
    "cross_agent": {
        **SHARED,
        **ATTEMPTED,
        "timeout_s": (ENGINE, "test_cross_agent_step_via_the_in_memory_dispatcher"),
        "retry": (ENGINE, "test_cross_agent_retry_keeps_the_request_id"),
        "target": (ENGINE, "test_cross_agent_step_via_the_in_memory_dispatcher"),
        "capability": (ENGINE, "test_cross_agent_step_via_the_in_memory_dispatcher"),
        "request": (ENGINE, "test_an_invalid_resolved_request_is_a_logic_failure_naming_the_field"),
    },
    "gate": {
        **SHARED,
        "timeout_s": (GATES, "test_a_gate_times_out"),
        "retry": Refused({"max_attempts": 2}, "cannot retry"),
        "compensate": Refused("undo", "compensation"),
        "compensate_input": Refused({"x": 1}, "compensation"),
        "on_policy_failure": Refused("gate", "on_policy_failure"),
        "prompt": (GATES, "test_a_plans_journal_holds_what_the_gate_asked_and_answered"),
        "input_schema": (GATES, "test_a_typed_value_reaches_a_later_step"),
        "choices": (
            GATES,
            "test_a_choice_not_offered_is_refused_and_an_offered_one_is_read_by_an_expression",
        ),
        "deciders": (GATES, "test_a_deny_for_an_identity_the_gate_does_not_name"),
        "on_timeout": (GATES, "test_a_timeout_with_a_default_value_feeds_it_to_the_next_step"),
        "default": (GATES, "test_a_timeout_with_a_default_value_feeds_it_to_the_next_step"),
        "escalate_after_s": (GATES, "test_an_undecided_gate_escalates"),
        "escalate_to": (GATES, "test_an_undecided_gate_escalates"),
    },
    "map": {
        **SHARED,
        **ATTEMPTED,
        "timeout_s": (HERE, "test_a_maps_timeout_bounds_each_item_attempt"),
        "retry": (DYNAMIC, "test_each_item_is_retried_on_its_own"),
        "compensate": (
            DYNAMIC,
            "test_a_failed_item_fails_the_map_and_items_and_steps_compensate_newest_first",
        ),
        "compensate_input": (
            DYNAMIC,
            "test_a_failed_item_fails_the_map_and_items_and_steps_compensate_newest_first",
        ),
        "on_policy_failure": Refused("gate", "on_policy_failure"),
        "over": (DYNAMIC, "test_a_map_runs_each_item_with_its_own_key_and_collects_in_item_order"),
        "max_items": (
            DYNAMIC,
            "test_a_map_over_what_is_not_a_list_or_too_long_fails_before_any_item",
        ),
        "max_parallel": (DYNAMIC, "test_a_map_runs_at_most_max_parallel_items_at_once"),
        "tool": (DYNAMIC, "test_a_map_runs_each_item_with_its_own_key_and_collects_in_item_order"),
        "input": (DYNAMIC, "test_a_map_runs_each_item_with_its_own_key_and_collects_in_item_order"),
        "target": (
            DYNAMIC,
            "test_a_map_sends_one_cross_agent_request_per_item_with_its_own_request_id",
        ),
        "capability": (
            DYNAMIC,
            "test_a_map_sends_one_cross_agent_request_per_item_with_its_own_request_id",
        ),
        "request": (
            DYNAMIC,
            "test_a_map_sends_one_cross_agent_request_per_item_with_its_own_request_id",
        ),
    },
    "loop": {
        **SHARED,
        **NO_COMPENSATION,
        "timeout_s": (HONOURED, "test_a_timeout_covers_a_loops_iterations_not_each_one"),
        "retry": (HONOURED, "test_a_loops_retry_runs_a_failed_iteration_again_after_undoing_it"),
        "steps": (DYNAMIC, "test_a_loop_repeats_its_body_until_its_condition_holds"),
        "until": (DYNAMIC, "test_a_loop_repeats_its_body_until_its_condition_holds"),
        "max_iterations": (
            DYNAMIC,
            "test_a_loop_that_reaches_its_bound_fails_or_succeeds_as_it_says",
        ),
        "timebox_s": (DYNAMIC, "test_a_timeboxed_loop_starts_no_iteration_past_its_timebox"),
        "on_exhausted": (
            DYNAMIC,
            "test_a_loop_that_reaches_its_bound_fails_or_succeeds_as_it_says",
        ),
        "inputs": (DYNAMIC, "test_a_loop_repeats_its_body_until_its_condition_holds"),
        "max_in_flight": (HERE, "test_a_nested_steps_max_in_flight_and_on_failure_reach_its_body"),
        "on_failure": (HERE, "test_a_nested_steps_max_in_flight_and_on_failure_reach_its_body"),
    },
    "subplan": {
        **SHARED,
        **NO_COMPENSATION,
        "timeout_s": (HONOURED, "test_a_nested_steps_timeout_fails_it_and_undoes_its_running_plan"),
        "retry": (HONOURED, "test_a_subplans_retry_runs_it_again_after_undoing_the_failed_attempt"),
        "steps": (DYNAMIC, "test_a_subplan_runs_a_nested_plan_and_gives_its_outputs"),
        "inputs": (DYNAMIC, "test_a_subplan_runs_a_nested_plan_and_gives_its_outputs"),
        "max_in_flight": (DYNAMIC, "test_engine_config_bound_applies_to_a_nested_plan"),
        "on_failure": (HERE, "test_a_nested_steps_max_in_flight_and_on_failure_reach_its_body"),
    },
}


def step_models() -> dict[str, type[BaseModel]]:
    union = typing.get_args(typing.get_args(Step)[0])
    return {model.model_fields["kind"].default: model for model in union}


def test_the_table_covers_every_field_of_every_step_kind() -> None:
    models = step_models()
    assert set(EVIDENCE) == set(models)
    for kind, model in models.items():
        assert set(EVIDENCE[kind]) == set(model.model_fields), kind


@pytest.mark.parametrize(
    "named",
    sorted({e for row in EVIDENCE.values() for e in row.values() if isinstance(e, tuple)}),
)
def test_each_named_test_exists(named: Test) -> None:
    module, test = named
    found = importlib.import_module(f"tests.unit.planning.{module}")
    assert callable(getattr(found, test, None)), named


def minimal(kind: str) -> dict[str, Any]:
    """A valid step of ``kind`` (id ``s``) for a plan of the perception agent with ``noop``."""
    body = [{"kind": "tool", "id": "t", "tool": "noop"}]
    return {
        "tool": {"tool": "noop"},
        "cross_agent": {"target": "strategic", "capability": "AnalyzeNarrative", "request": {}},
        "gate": {"prompt": "go on?"},
        "map": {"over": "inputs.xs", "max_items": 3, "tool": "noop"},
        "loop": {"steps": body, "max_iterations": 2},
        "subplan": {"steps": body},
    }[kind] | {"kind": kind, "id": "s"}


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        (kind, field)
        for kind, row in EVIDENCE.items()
        for field, evidence in row.items()
        if isinstance(evidence, Refused)
    ],
)
def test_a_refused_field_is_refused_in_one_line_naming_the_step(kind: str, field: str) -> None:
    refused = EVIDENCE[kind][field]
    assert isinstance(refused, Refused)
    plan = Plan(id="p", owner="perception", goal="g", inputs={"xs": [1]}, steps=[minimal(kind)])
    validate_plan(plan, tools={"noop", "undo"})  # the step is valid without the field...
    bad = plan.model_copy(
        update={
            "steps": [type(plan.steps[0]).model_validate(minimal(kind) | {field: refused.value})]
        }
    )
    with pytest.raises(PlanValidationError) as info:
        validate_plan(bad, tools={"noop", "undo"})  # ... and refused with it
    [problem] = info.value.problems
    assert "'s'" in problem
    assert refused.words in problem
    assert "\n" not in problem


# --- behaviour tests for the fields no other test proves ----------------------------------------


async def test_a_submitted_status_is_the_engines_to_set() -> None:
    """``status`` is the engine's to write: a submitted one does not stop the step running, and
    the plan a run returns carries what happened."""
    plan = Plan(
        id="p",
        owner="t",
        goal="g",
        steps=[{"kind": "tool", "id": "a", "tool": "noop", "status": "succeeded"}],
    )
    runner = DictToolRunner({"noop": noop})
    result = await Engine(tools=runner, agent="t").run(plan)
    assert runner.calls == [("noop", "a", 1)]
    assert result.plan.steps[0].status is StepStatus.SUCCEEDED
    assert result.statuses == {"a": StepStatus.SUCCEEDED}


def test_a_title_is_carried_with_the_plan_for_people() -> None:
    """``title`` describes the step for people (plans show --json, the console's plan body):
    it travels with the plan and changes nothing that runs."""
    plan = Plan(
        id="p",
        owner="t",
        goal="g",
        steps=[{"kind": "tool", "id": "a", "tool": "noop", "title": "Say"}],
    )
    again = Plan.model_validate_json(plan.model_dump_json())
    assert again.steps[0].title == "Say"


async def test_a_maps_timeout_bounds_each_item_attempt() -> None:
    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(5 if input["n"] == 2 else 0)
        return {}

    plan = Plan(
        id="p",
        owner="t",
        goal="g",
        inputs={"ns": [1, 2]},
        steps=[
            {
                "kind": "map",
                "id": "m",
                "over": "inputs.ns",
                "max_items": 2,
                "tool": "slow",
                "input": {"n": {"$expr": "item"}},
                "timeout_s": 0.05,
                "retry": {"max_attempts": 1},
            }
        ],
    )
    result = await Engine(tools=DictToolRunner({"slow": slow}), agent="t").run(plan)
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].failure_class.value == "timeout"


@pytest.mark.parametrize("kind", ["loop", "subplan"])
async def test_a_nested_steps_max_in_flight_and_on_failure_reach_its_body(kind: str) -> None:
    """``max_in_flight`` bounds the body; ``on_failure: continue_independent`` lets the body's
    independent steps finish after one failed (with ``fail_fast`` they are cancelled)."""
    ran: list[str] = []

    async def boom(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        raise RuntimeError("boom")

    async def note(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        ran.append(ctx.step_id)
        return {}

    body = [
        {"kind": "tool", "id": "bad", "tool": "boom", "priority": 1},
        {"kind": "tool", "id": "other", "tool": "note"},
    ]
    step: dict[str, Any] = {
        "kind": kind,
        "id": "s",
        "steps": body,
        "max_in_flight": 1,  # "bad" first (its priority), alone: "other" waits for a slot
        "on_failure": "continue_independent",
    }
    if kind == "loop":
        step["max_iterations"] = 1
    plan = Plan(id="p", owner="t", goal="g", steps=[step])
    tools = DictToolRunner({"boom": boom, "note": note})
    result = await Engine(tools=tools, agent="t").run(plan)
    assert result.status is PlanStatus.FAILED
    assert ran == ["other"]  # ran after "bad" failed: continue_independent
    ran.clear()
    fail_fast = plan.model_copy(
        update={"steps": [type(plan.steps[0]).model_validate(step | {"on_failure": "fail_fast"})]}
    )
    result = await Engine(tools=tools, agent="t").run(fail_fast)
    assert result.status is PlanStatus.FAILED
    assert ran == []  # the body stopped at its first failure
