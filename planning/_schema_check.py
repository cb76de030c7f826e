"""Foreign JSON Schemas applied within bounds: no pattern, and no value, can hold a check for long.

A schema that came from elsewhere (an MCP tool's ``inputSchema`` or ``outputSchema``, a gate's
``input_schema``) may hold a regular expression that backtracks catastrophically (``^(a+)+$``
against ``"a" * 30 + "!"`` takes Python's ``re`` about a minute, holding the GIL all along).
``schema_validator`` builds a ``jsonschema`` validator of the schema's draft whose ``pattern``,
``patternProperties`` and ``additionalProperties`` match with the ``regex`` engine, which
releases the GIL while it matches and stops at a deadline; ``schema_errors`` runs a check against
one deadline (``SCHEMA_CHECK_SECONDS`` by default) and turns an expired deadline, or a value
nested past Python's recursion limit, into one plain ``ValidationError`` instead of a hang or a
traceback. A check run in a worker thread (``asyncio.to_thread``) therefore leaves the event loop
free, and ends by the deadline whatever it meets.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import regex
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend, validator_for

__all__ = ["SCHEMA_CHECK_SECONDS", "schema_errors", "schema_validator"]

SCHEMA_CHECK_SECONDS: Final = 2.0
"""How long one value's check against a foreign schema may take, regular expressions included."""

# The deadline (time.monotonic()) of the check under way in this thread or task, if any.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "stratagem_schema_deadline", default=None
)


class _Expired(Exception):
    """The check's deadline passed while a pattern was matching (``pattern`` names it)."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.pattern = pattern


def schema_validator(schema: dict[str, Any]) -> Validator:
    """A validator of ``schema`` (the draft it names, 2020-12 by default) whose regular
    expressions are matched within ``schema_errors``'s deadline.

    Raises:
        jsonschema.SchemaError: ``schema`` is not a valid JSON Schema of its draft.
    """
    cls = validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    validator: Validator = _bounded(cls)(schema)
    return validator


def schema_errors(
    validator: Validator, instance: Any, *, seconds: float = SCHEMA_CHECK_SECONDS
) -> list[ValidationError]:
    """Every way ``instance`` breaks ``validator``'s schema, found within ``seconds``.

    A check that does not finish in time, or meets a value nested too deeply to walk, ends with
    one ``ValidationError`` saying so (the check could not say the value fits, so it does not).
    """
    token = _deadline.set(time.monotonic() + seconds)
    try:
        return list(validator.iter_errors(instance))
    except _Expired as exc:
        return [
            ValidationError(
                f"checking the value took over {seconds:g} s (pattern {_shown(exc.pattern)}"
                " backtracks too much): it is refused"
            )
        ]
    except RecursionError:
        return [ValidationError("the value is nested too deeply to check: it is refused")]
    except regex.error as exc:
        return [ValidationError(f"a pattern of the schema cannot be used: {exc}")]
    finally:
        _deadline.reset(token)


@functools.cache
def _bounded(cls: type[Validator]) -> type[Validator]:
    extended: type[Validator] = extend(  # type: ignore[no-untyped-call]
        cls,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
    return extended


def _search(pattern: str, text: str) -> bool:
    deadline = _deadline.get()
    left = SCHEMA_CHECK_SECONDS if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise _Expired(pattern)
    try:
        return _compiled(pattern).search(text, timeout=left) is not None
    except TimeoutError:
        raise _Expired(pattern) from None


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


def _pattern(
    validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{_shown(instance)} does not match {pattern!r}")


# The keywords' validator is jsonschema's own class (its ``descend`` is not in the protocol).
def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras, key=str))
        if patterns:
            yield ValidationError(
                f"{listed} {'does' if len(extras) == 1 else 'do'} not match any of the regexes: "
                + ", ".join(repr(pattern) for pattern in sorted(patterns))
            )
        else:
            yield ValidationError(
                f"Additional properties are not allowed ({listed}"
                f" {'was' if len(extras) == 1 else 'were'} unexpected)"
            )


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
