"""Plan validation: one clear sentence per problem."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.planning import PlanValidationError, validate_plan
from stratagem.protocol import CapabilitySpec, WireModel

from ._support import cross_step, make_plan, tool_step

TOOLS = {"noop", "extract", "resolve"}


def problems_of(plan: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan, tools=kwargs.pop("tools", TOOLS), **kwargs)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def test_a_valid_plan_passes() -> None:
    plan = make_plan(
        tool_step("read", tool="extract"),
        tool_step("link", "read", tool="resolve", input={"ids": {"$ref": "read.entities[*].id"}}),
        cross_step(
            "arc",
            "strategic",
            "PlanNarrativeArc",
            {"goal": "escape", "protagonist": {"$ref": "read.entities[0].id"}},
            "link",
        ),
    )
    validate_plan(plan, tools=TOOLS)


def test_duplicate_ids() -> None:
    plan = make_plan(tool_step("a"), tool_step("b"), tool_step("a"))
    assert problems_of(plan) == ["duplicate step id 'a' (2 steps)"]


def test_unknown_dependency() -> None:
    assert problems_of(make_plan(tool_step("a"), tool_step("b", "x"))) == [
        "step 'b' depends on unknown step 'x'"
    ]


def test_cycle_is_named() -> None:
    plan = make_plan(tool_step("a", "b"), tool_step("b", "a"))
    assert problems_of(plan) == ["cycle: a -> b -> a"]


def test_tool_not_in_the_registry() -> None:
    plan = make_plan(tool_step("s1", tool="move_actor"))
    assert problems_of(plan) == [
        "step 's1' uses tool 'move_actor', which is not in the perception agent's registry"
    ]


def test_unknown_role() -> None:
    plan = make_plan(cross_step("s2", "wizard", "ExtractEntities", {"text": "hi"}))
    assert problems_of(plan) == ["step 's2' targets unknown role 'wizard'"]


def test_capability_the_role_does_not_serve() -> None:
    plan = make_plan(cross_step("s2", "tactical", "ExtractEntities", {"text": "hi"}))
    assert problems_of(plan) == [
        "step 's2' asks the tactical agent for capability 'ExtractEntities', which that role "
        "does not serve (it serves: PlanExecutionSequence)"
    ]


def test_cross_agent_step_to_the_owner() -> None:
    plan = make_plan(cross_step("s2", "perception", "ExtractEntities", {"text": "hi"}))
    assert problems_of(plan) == [
        "step 's2' targets its own agent ('perception'); use one of its tools instead"
    ]


def test_request_without_refs_is_validated_by_field() -> None:
    plan = make_plan(
        cross_step(
            "s2",
            "strategic",
            "PlanNarrativeArc",
            {"goal": "", "protagonist": "Mira", "beats": 9},
        )
    )
    assert problems_of(plan) == [
        "step 's2' request for PlanNarrativeArc: goal: String should have at least 1 character",
        "step 's2' request for PlanNarrativeArc: protagonist: String should match pattern "
        "'^[a-z][a-z0-9_]{0,63}$'",
        "step 's2' request for PlanNarrativeArc: beats: Input should be less than or equal to 8",
    ]


def test_nested_request_field_paths() -> None:
    beat = {"id": "b0", "title": "t", "goals": [{"subject": "mira", "predicate": "flies"}]}
    plan = make_plan(
        cross_step(
            "s2",
            "tactical",
            "PlanExecutionSequence",
            {"beat": beat, "facts": [{"subject": "a", "predicate": "at", "object": "b"}]},
        )
    )
    problems = problems_of(plan)
    assert problems[0].startswith("step 's2' request for PlanExecutionSequence: beat.goals[0].")
    assert any("beat.goals[0].object: Field required" in p for p in problems)


def test_request_with_refs_is_checked_for_unknown_fields_only() -> None:
    plan = make_plan(
        tool_step("read", tool="extract"),
        cross_step(
            "s2",
            "strategic",
            "AnalyzeNarrative",
            {"text": {"$ref": "read.text"}, "mood": "dark"},
            "read",
        ),
    )
    assert problems_of(plan) == [
        "step 's2' request for AnalyzeNarrative: mood: Extra inputs are not permitted"
    ]


def test_ref_to_a_step_that_is_not_a_dependency() -> None:
    plan = make_plan(
        tool_step("a"),
        tool_step("b"),
        tool_step("c", "b", input={"x": {"$ref": "a.step"}}),
        tool_step("d", "c", input={"x": {"$ref": "b.step"}, "y": {"$ref": "ghost.z"}}),
        tool_step("e", input={"x": {"$ref": "e.step"}}),
    )
    assert problems_of(plan) == [
        "step 'c' references step 'a' in 'a.step', which is not among its (transitive) "
        "dependencies",
        "step 'd' references unknown step 'ghost' in 'ghost.z'",
        "step 'e' references step 'e' in 'e.step', which is not among its (transitive) "
        "dependencies",
    ]


def test_bad_reference_syntax() -> None:
    plan = make_plan(tool_step("a"), tool_step("b", "a", input={"x": {"$ref": "a..x"}}))
    (problem,) = problems_of(plan)
    assert problem.startswith("step 'b' has an invalid reference: reference 'a..x': expected")


def test_every_problem_is_reported_at_once() -> None:
    plan = make_plan(
        tool_step("a", "b"),
        tool_step("b", "a"),
        tool_step("c", tool="fly"),
        cross_step("d", "wizard", "Spell", {}),
    )
    assert problems_of(plan) == [
        "cycle: a -> b -> a",
        "step 'c' uses tool 'fly', which is not in the perception agent's registry",
        "step 'd' targets unknown role 'wizard'",
    ]


class PingRequest(WireModel):
    n: int


class PingResponse(WireModel):
    n: int


def test_injected_roles_and_capabilities() -> None:
    caps = {"Ping": CapabilitySpec("Ping", "echo", "extension", PingRequest, PingResponse)}
    good = make_plan(cross_step("p", "echo", "Ping", {"n": 1}))
    validate_plan(good, tools=TOOLS, roles={"echo"}, capabilities=caps)
    bad = make_plan(cross_step("p", "echo", "Ping", {"n": "x"}))
    assert problems_of(bad, roles={"echo"}, capabilities=caps) == [
        "step 'p' request for Ping: n: Input should be a valid integer, unable to parse string "
        "as an integer"
    ]
    # By default, a role is known when it serves a capability.
    validate_plan(good, tools=TOOLS, capabilities=caps)
    assert problems_of(good, roles={"strategic"}, capabilities=caps) == [
        "step 'p' targets unknown role 'echo'"
    ]
