"""The plans' expression language (JMESPath): parsing, checks, values, and its use in plans."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.planning import (
    Engine,
    ExpressionError,
    FailureClass,
    PlanStatus,
    PlanValidationError,
    Ref,
    RefError,
    ToolContext,
    expr,
    expression,
    refs_in,
    resolve_refs,
    validate_plan,
)

from ._support import DictToolRunner, echo, make_plan, noop, tool_step

OUTPUTS: dict[str, Any] = {
    "extract": {
        "entities": [{"id": "mira", "kind": "character"}, {"id": "key", "kind": "object"}],
        "count": 2,
    },
    "arc": {"beats": [{"id": "b0", "goals": [{"object": "door"}]}, {"id": "b1", "goals": []}]},
    "step-2": {"total": 7},
}


@pytest.mark.parametrize(
    ("text", "steps", "inputs"),
    [
        ("extract.entities[*].id", {"extract"}, False),
        ("length(extract.entities) > `1`", {"extract"}, False),
        ("inputs.language == 'en'", set(), True),
        ('"step-2".total', {"step-2"}, False),
        ("extract.entities[?kind == 'object'].id | [0]", {"extract"}, False),
        ("sort_by(extract.entities, &id)[-1].id", {"extract"}, False),
        ("not_null(arc.missing, extract.count)", {"arc", "extract"}, False),
        ("{n: extract.count, b: arc.beats[0].id}", {"arc", "extract"}, False),
    ],
)
def test_an_expression_names_the_steps_it_reads(text: str, steps: set[str], inputs: bool) -> None:
    parsed = expression(text)
    assert (set(parsed.steps), parsed.reads_inputs) == (steps, inputs)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("extract.entities[*].id", ["mira", "key"]),
        ("length(extract.entities) > `1`", True),
        ("inputs.language", "en"),
        ('"step-2".total', 7),
        ("extract.entities[?kind == 'object'].id | [0]", "key"),
        ("arc.beats[1].goals[0].object", None),  # an expression's "nothing" is null
        ("missing.x", None),  # a step without an output reads as null
    ],
)
def test_values(text: str, value: Any) -> None:
    assert expression(text).evaluate(OUTPUTS, {"language": "en"}) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("extract.", "does not parse at column 8"),
        ("length(extract", "the expression is incomplete"),
        ("", "the expression is empty"),
        ("nope(extract)", "unknown function nope()"),
        ("length(extract, arc)", "length() takes 1 argument(s), not 2"),
        ("@", "it reads the whole document (@)"),
        ("*.count", "it reads the whole document (*)"),
        ("[*].count", "it reads the whole document (@)"),
    ],
)
def test_bad_expressions_are_one_line_naming_the_expression(text: str, reason: str) -> None:
    with pytest.raises(ExpressionError) as info:
        expression(text)
    message = str(info.value)
    assert message.startswith(f"expression {text!r}: {reason}")
    assert "\n" not in message
    assert isinstance(info.value, RefError)  # caught where references are


def test_evaluation_errors_name_the_expression() -> None:
    with pytest.raises(ExpressionError, match=r"^expression 'abs\(extract\)': In function abs"):
        expression("abs(extract)").evaluate(OUTPUTS, {})


@pytest.mark.parametrize(
    "text",
    [
        "extract",
        "extract.count",
        "extract.entities[*].id",
        "extract.entities[-1].kind",
        "extract.entities[0:1]",
        "arc.beats[*].goals[*].object",
    ],
)
def test_a_ref_is_an_expression_with_the_same_value(text: str) -> None:
    # The compatibility path: every $ref is the JMESPath expression Ref.expression, strict.
    ref = Ref.parse(text)
    assert expression(ref.expression).evaluate(OUTPUTS, {}) == ref.resolve(OUTPUTS)
    assert expression(ref.expression).steps == {ref.step_id}


def test_resolve_refs_resolves_both_forms() -> None:
    value = {
        "ids": {"$expr": "extract.entities[*].id"},
        "lang": {"$expr": "inputs.language"},
        "count": {"$ref": "extract.count"},
        "plain": [1, {"x": 2}],
    }
    resolved = resolve_refs(value, OUTPUTS, {"language": "en"})
    assert resolved == {"ids": ["mira", "key"], "lang": "en", "count": 2, "plain": [1, {"x": 2}]}
    assert refs_in(value) == {"extract"}
    assert expr("extract.count") == {"$expr": "extract.count"}
    with pytest.raises(ExpressionError, match="must have no other keys"):
        resolve_refs({"$expr": "extract", "also": 1}, OUTPUTS)
    with pytest.raises(ExpressionError, match="does not parse"):
        expr("extract.")


TOOLS = {"noop", "echo"}


def problems_of(plan: Any) -> list[str]:
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan, tools=TOOLS)
    return info.value.problems


def test_validation_accepts_expressions_over_dependencies_and_inputs() -> None:
    plan = make_plan(
        tool_step("read"),
        tool_step("mid", "read"),
        tool_step(
            "use",
            "mid",
            tool="echo",
            input={"a": {"$expr": "read.step"}, "b": {"$expr": "inputs.topic"}},
        ),
        inputs={"topic": "keys"},
    )
    validate_plan(plan, tools=TOOLS)


@pytest.mark.parametrize(
    ("expression_text", "problem"),
    [
        (
            "ghost.items",
            "step 'use' references unknown step 'ghost' in 'ghost.items'",
        ),
        (
            "later.step",
            "step 'use' references step 'later' in 'later.step', which is not among its "
            "(transitive) dependencies",
        ),
        (
            "use.step",
            "step 'use' references step 'use' in 'use.step', which is not among its "
            "(transitive) dependencies",
        ),
        (
            "read.",
            "step 'use' has an invalid expression: expression 'read.': does not parse at "
            "column 5: Expecting: ['quoted_identifier', 'unquoted_identifier', 'lbracket', "
            "'lbrace'], got: eof",
        ),
        (
            "size(read.items)",
            "step 'use' has an invalid expression: expression 'size(read.items)': unknown "
            "function size()",
        ),
    ],
)
def test_validation_refuses_bad_expressions_naming_step_and_expression(
    expression_text: str, problem: str
) -> None:
    plan = make_plan(
        tool_step("read"),
        tool_step("use", "read", tool="echo", input={"x": {"$expr": expression_text}}),
        tool_step("later", "use"),
    )
    problems = problems_of(plan)
    assert len(problems) == 1
    assert problems[0].startswith(problem)


async def test_a_step_input_reads_outputs_and_the_plans_inputs() -> None:
    async def count(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"items": [{"n": 1}, {"n": 5}, {"n": 3}]}

    tools = DictToolRunner({"count": count, "echo": echo, "noop": noop})
    plan = make_plan(
        tool_step("count", tool="count"),
        tool_step(
            "use",
            "count",
            tool="echo",
            input={
                "biggest": {"$expr": "max(count.items[*].n)"},
                "many": {"$expr": "length(count.items) > `2`"},
                "topic": {"$expr": "inputs.topic"},
                "legacy": {"$ref": "count.items[0].n"},
            },
        ),
        inputs={"topic": "keys"},
    )
    result = await Engine(tools=tools, agent="perception").run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["use"] == {"biggest": 5, "many": True, "topic": "keys", "legacy": 1}


async def test_an_expression_failing_at_run_time_fails_its_step_as_logic() -> None:
    tools = DictToolRunner({"echo": echo, "noop": noop})
    plan = make_plan(
        tool_step("read"),
        tool_step("use", "read", tool="echo", input={"x": {"$expr": "abs(read.step)"}}),
    )
    result = await Engine(tools=tools, agent="perception").run(plan)
    assert result.status is PlanStatus.FAILED
    failure = result.failures[0]
    assert (failure.step_id, failure.failure_class) == ("use", FailureClass.LOGIC)
    assert failure.message.startswith("expression 'abs(read.step)': In function abs()")


@pytest.mark.parametrize(
    "text",
    [
        "(" * 500 + "a" + ")" * 500,  # before: RecursionError, INTERNAL and a 3,000-line traceback
        "!" * 900 + "a",  # nesting without brackets: the parser recursed
        "[" * 300 + "a" + "]" * 300,
        " || ".join(["a"] * 100),  # a flat text whose tree is 100 deep
    ],
)
def test_an_expression_nested_too_deeply_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ExpressionError) as refused:
        expression(text)
    message = str(refused.value)
    assert message.endswith("...': nested deeper than 64 levels")
    assert len(message) < 120


def test_nesting_up_to_the_bound_and_brackets_in_quotes_are_fine() -> None:
    assert expression("(" * 64 + "a" + ")" * 64).steps == {"a"}
    assert expression("a.b[?x == `" + "[" * 100 + "1" + "]" * 100 + "`]").steps == {"a"}
    assert expression("a == '" + "(" * 100 + "'").steps == {"a"}


def test_a_condition_nested_too_deeply_is_a_validation_problem_naming_step_and_field() -> None:
    deep = "(" * 500 + "a.ok" + ")" * 500
    plan = make_plan(tool_step("a"), tool_step("b", "a", when=deep))
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan, tools={"noop"})
    assert info.value.problems == [
        "step 'b' has an invalid condition: expression '" + "(" * 40 + "...': nested deeper "
        "than 64 levels"
    ]
