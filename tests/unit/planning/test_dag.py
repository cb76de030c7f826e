"""DAG algorithms: layers and cycles."""

from __future__ import annotations

import pytest

from stratagem.planning import PlanValidationError, find_cycle, topological_layers

from ._support import tool_step


def test_layers_group_by_depth_in_plan_order() -> None:
    steps = [
        tool_step("d", "b", "c"),
        tool_step("a"),
        tool_step("c", "a"),
        tool_step("b", "a"),
        tool_step("e"),
        tool_step("f", "a", "d"),
    ]
    assert topological_layers(steps) == [["a", "e"], ["c", "b"], ["d"], ["f"]]


def test_layers_of_nothing() -> None:
    assert topological_layers([]) == []


def test_repeated_dependency_counts_once() -> None:
    assert topological_layers([tool_step("a"), tool_step("b", "a", "a")]) == [["a"], ["b"]]


def test_layers_refuse_a_cycle_and_unknown_dependencies() -> None:
    with pytest.raises(PlanValidationError) as info:
        topological_layers([tool_step("a", "b"), tool_step("b", "a"), tool_step("c", "x")])
    assert info.value.problems == [
        "step 'c' depends on unknown step 'x'",
        "cycle: a -> b -> a",
    ]


def test_find_cycle_returns_the_closed_path() -> None:
    steps = [tool_step("s"), tool_step("a", "s", "b"), tool_step("b", "c"), tool_step("c", "a")]
    assert find_cycle(steps) == ["a", "b", "c", "a"]


def test_find_cycle_self_loop() -> None:
    assert find_cycle([tool_step("a", "a")]) == ["a", "a"]


def test_find_cycle_none_for_a_dag_ignoring_unknown_steps() -> None:
    steps = [tool_step("a"), tool_step("b", "a", "ghost"), tool_step("c", "a", "b")]
    assert find_cycle(steps) is None


def test_long_chain_needs_no_recursion() -> None:
    steps = [tool_step("s0")] + [tool_step(f"s{i}", f"s{i - 1}") for i in range(1, 5000)]
    assert find_cycle(steps) is None
    layers = topological_layers(steps)
    assert len(layers) == 5000
    assert layers[-1] == ["s4999"]
    looped = [tool_step("s0", "s4999"), *steps[1:]]
    cycle = find_cycle(looped)
    assert cycle is not None
    assert len(cycle) == 5001
    assert cycle[0] == cycle[-1] == "s0"
