"""Tool types from JSON Schemas: the input and output models of an MCP server's tools.

An MCP tool declares its input (and, optionally, its output) as a JSON Schema. The registry's
models for such a tool are generated from that schema rather than from Python annotations: they
validate with ``jsonschema`` (the draft the schema names, 2020-12 by default, as MCP says), keep
every property as it came, and give the schema back from ``model_json_schema`` so that a model
planner's answer schema (``plan_answer_schema``) carries the server's own constraints.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Final

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.protocols import Validator
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from stratagem.planning import schema_errors, schema_validator

__all__ = ["SCHEMA_ERROR", "JsonSchemaModel", "json_schema_model"]

SCHEMA_ERROR: Final = "json_schema"
"""The pydantic error type of a value that breaks its JSON Schema (its message names the path)."""

_MAX_PROBLEMS: Final = 5


class JsonSchemaModel(BaseModel):
    """A JSON object validated against a JSON Schema; ``json_schema_model`` makes the subclasses.

    The object's properties are kept as they came (``model_dump()`` gives them back); the
    class's ``model_json_schema()`` is the schema itself.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    schema_: ClassVar[dict[str, Any]] = {"type": "object"}
    validator_: ClassVar[Validator] = Draft202012Validator({"type": "object"})
    # A foreign schema's check may take up to its deadline: the registry validates it off the
    # event loop (``agents._tool.VALIDATES_OFF_LOOP``).
    validates_off_loop_: ClassVar[bool] = True

    @model_validator(mode="before")
    @classmethod
    def _conforms(cls, data: Any) -> Any:
        if isinstance(data, JsonSchemaModel):
            data = data.model_dump(mode="json")
        # Bounded: a pattern that backtracks, or a value nested past the recursion limit, ends
        # the check by its deadline with one error (planning.schema_errors).
        errors = sorted(schema_errors(cls.validator_, data), key=lambda e: list(e.absolute_path))
        if errors:
            problems = [_problem(error) for error in errors[:_MAX_PROBLEMS]]
            if len(errors) > _MAX_PROBLEMS:
                problems.append(f"and {len(errors) - _MAX_PROBLEMS} more")
            raise PydanticCustomError(SCHEMA_ERROR, "{problems}", {"problems": "; ".join(problems)})
        if not isinstance(data, dict):
            raise PydanticCustomError(
                SCHEMA_ERROR, "a JSON object is needed, not {kind}", {"kind": type(data).__name__}
            )
        return data

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The JSON Schema the model validates against (a copy)."""
        return copy.deepcopy(cls.schema_)


def _problem(error: Any) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = str(error.message)
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{path}: {message}" if path else message


def json_schema_model(name: str, schema: dict[str, Any]) -> type[JsonSchemaModel]:
    """A model of the JSON objects ``schema`` accepts.

    Args:
        name: The class's name (shown in errors and schemas).
        schema: A JSON Schema of an object (MCP's ``inputSchema`` or ``outputSchema``).

    Raises:
        ValueError: The schema is not a valid JSON Schema, or does not describe an object.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"{name}: the schema is {type(schema).__name__}, not an object")
    if schema.get("type", "object") != "object":
        raise ValueError(f"{name}: the schema describes {schema.get('type')!r}, not an object")
    owned = copy.deepcopy(schema)
    try:
        validator = schema_validator(owned)
    except SchemaError as exc:
        raise ValueError(f"{name}: not a valid JSON Schema: {_problem(exc)}") from None
    model: type[JsonSchemaModel] = type(
        name,
        (JsonSchemaModel,),
        {"schema_": owned, "validator_": validator, "__module__": __name__},
    )
    return model
