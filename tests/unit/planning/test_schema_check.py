"""Foreign JSON Schemas are applied within bounds: a backtracking pattern or a value nested past
the recursion limit ends the check by its deadline with one plain error."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from jsonschema import SchemaError

from stratagem.planning import schema_errors, schema_validator

# Neither Python's re nor the regex engine shortcut this one: it backtracks exponentially.
GREEDY = "^(a|aa)+$"


def _messages(schema: dict[str, Any], value: Any, **kw: Any) -> list[str]:
    return [error.message for error in schema_errors(schema_validator(schema), value, **kw)]


def test_a_value_that_fits_has_no_errors_and_one_that_does_not_names_the_pattern() -> None:
    schema = {"type": "string", "pattern": "^[a-z]+$"}
    assert _messages(schema, "abc") == []
    assert _messages(schema, "ab1") == ["'ab1' does not match '^[a-z]+$'"]


def test_a_backtracking_pattern_is_stopped_at_the_deadline() -> None:
    started = time.monotonic()
    (message,) = _messages({"type": "string", "pattern": GREEDY}, "a" * 60 + "!", seconds=0.5)
    # With the stdlib's re this check would run for years; a generous bound on the deadline.
    assert time.monotonic() - started < 10
    assert message.startswith("checking the value took over 0.5 s (pattern '^(a|aa)+$'")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {GREEDY: {"type": "integer"}}},
        {
            "type": "object",
            "properties": {},
            "additionalProperties": False,
            "patternProperties": {GREEDY: True},
        },
    ],
)
def test_property_name_patterns_are_bounded_too(schema: dict[str, Any]) -> None:
    (message,) = _messages(schema, {"a" * 60 + "!": 1}, seconds=0.5)
    assert message.startswith("checking the value took over 0.5 s")


def test_pattern_properties_and_additional_properties_still_mean_what_they_say() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert _messages(schema, {"id": "a", "x-n": 1}) == []
    assert _messages(schema, {"x-n": "one"}) == ["'one' is not of type 'integer'"]
    assert _messages(schema, {"other": 1}) == ["'other' does not match any of the regexes: '^x-'"]
    assert _messages({"type": "object", "additionalProperties": False}, {"a": 1}) == [
        "Additional properties are not allowed ('a' was unexpected)"
    ]


def test_a_value_nested_past_the_recursion_limit_is_refused_in_one_error() -> None:
    value: Any = "leaf"
    for _ in range(5000):
        value = [value]
    schema = {
        "$defs": {"n": {"anyOf": [{"type": "string"}, {"items": {"$ref": "#/$defs/n"}}]}},
        "$ref": "#/$defs/n",
    }
    assert _messages(schema, value) == ["the value is nested too deeply to check: it is refused"]


def test_an_invalid_schema_is_refused() -> None:
    with pytest.raises(SchemaError):
        schema_validator({"type": "object", "minLength": "x"})


async def test_a_check_in_a_thread_leaves_the_event_loop_free() -> None:
    validator = schema_validator({"type": "string", "pattern": GREEDY})
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.02)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    try:
        errors = await asyncio.to_thread(schema_errors, validator, "a" * 60 + "!", seconds=1.0)
    finally:
        ticker.cancel()
    assert len(errors) == 1
    # The regex engine lets go of the GIL while it matches: the loop kept ticking.
    assert len(gaps) > 5
    assert max(gaps) < 1.0
