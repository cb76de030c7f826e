"""What a gate asks: a gate's input schema and choices, and a decision's value checked against them.

A gate that asks (``GateStep.input_schema`` or ``GateStep.choices``) takes a value with its
approval. ``schema_problem`` checks the schema itself when the plan is validated (it must be a
valid JSON Schema of the draft it names, 2020-12 by default); ``value_problem`` checks a value
when a decision is given: the field that does not fit and why, e.g. ``("value.amount", "'ten' is
not of type 'number'")`` or ``("value", "'maybe' is not one of the choices 'yes', 'no'")``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Final

from jsonschema import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from jsonschema.protocols import Validator

from stratagem.planning._plan import GateStep
from stratagem.planning._schema_check import schema_errors, schema_validator

__all__ = ["VALUE", "choices_problem", "schema_problem", "value_problem"]

VALUE: Final = "value"
"""The name a decision's value goes by in messages (and in the gate's output)."""

# The longest value quoted in a message.
_SHOWN: Final = 80


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What is wrong with ``schema`` as a JSON Schema (``None``: nothing)."""
    try:
        _validator(_canonical(schema))
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"{exc.message}" + (f" (at {where})" if where else "")
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def choices_problem(choices: list[Any]) -> str | None:
    """What is wrong with a gate's ``choices`` (``None``: nothing): they must be distinct."""
    seen: set[str] = set()
    for choice in choices:
        key = _canonical(choice)
        if key in seen:
            return f"the choice {_shown(choice)} is given twice"
        seen.add(key)
    return None


def value_problem(step: GateStep, value: Any, given: bool) -> tuple[str, str] | None:
    """What is wrong with ``value`` as the value of an approval of ``step``: the field that does
    not fit and why, in one line each (``None``: it fits).

    Args:
        step: The gate.
        value: The value given (``None`` may be a value).
        given: Whether a value was given at all.
    """
    if not step.asks:
        if given:
            return VALUE, f"gate {step.id!r} asks no value: approve it without one"
        return None
    if not given:
        what = "one of its choices" if step.choices is not None else "a value of its input_schema"
        return VALUE, f"gate {step.id!r} asks {what}: give it with the approval"
    if step.choices is not None:
        key = _canonical(value)
        if not any(_canonical(choice) == key for choice in step.choices):
            offered = ", ".join(_shown(choice) for choice in step.choices)
            return VALUE, f"{_shown(value)} is not one of the choices {offered}"
        return None
    assert step.input_schema is not None
    validator = _validator(_canonical(step.input_schema))
    error = min(
        schema_errors(validator, value),
        key=lambda e: (len(e.absolute_path), str(e.message)),
        default=None,
    )
    if error is None:
        return None
    return _path(error), _one_line(error.message)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator:
    """A validator of the schema (its draft, 2020-12 by default), checked, its patterns matched
    within a deadline; cached by its JSON."""
    schema = json.loads(schema_json)
    if not isinstance(schema, dict):
        raise SchemaError("a JSON Schema must be an object")
    return schema_validator(schema)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _path(error: SchemaValidationError) -> str:
    path = VALUE
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _canonical(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:300] + "..."
