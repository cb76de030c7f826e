"""The JSON Schema a model's plan answers in (``plan_answer_schema``): one agent's tools, each
with its own input schema, as tool, map, loop and sub-plan steps, every array and string bounded
(small models need the bounds)."""

from __future__ import annotations

from typing import Any, Final

from stratagem.agents._tool import ToolRegistry
from stratagem.planning import STEP_ID_PATTERN

__all__ = ["plan_answer_schema"]


def _hoist(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` moved into ``defs`` under ``prefix`` (refs rewritten)."""
    own = schema.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                    out[key] = f"#/$defs/{prefix}{value.removeprefix('#/$defs/')}"
                else:
                    out[key] = rewrite(value)
            return out
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    for name, definition in own.items():
        defs[f"{prefix}{name}"] = rewrite(definition)
    return rewrite(schema)  # type: ignore[no-any-return]


_EXPRESSION: Final = {
    "type": "object",
    "additionalProperties": False,
    "required": ["$expr"],
    "properties": {"$expr": {"type": "string", "minLength": 1, "maxLength": 300}},
}
"""A value written as an expression (``{"$expr": "search.hits[0]"}``), in place of a literal."""

_INPUT_VALUE: Final = {
    "anyOf": [
        {"type": "string", "maxLength": 2000},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "array", "maxItems": 20, "items": {"type": "string", "maxLength": 2000}},
    ]
}


def _flow(step_id: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """The fields every step may have: its dependencies, condition, trigger and priority."""
    return {
        "depends_on": {"type": "array", "items": step_id, "maxItems": max_steps},
        "when": {"type": "string", "minLength": 1, "maxLength": 300},
        "runs_on": {"type": "string", "enum": ["success", "failure"]},
        "priority": {"type": "integer", "minimum": -10, "maximum": 10},
    }


def _tool_steps(
    registry: ToolRegistry,
    defs: dict[str, Any],
    step_id: dict[str, Any],
    flow: dict[str, Any],
    max_items: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A tool step and a map step per tool of ``registry`` (each tool's input schema in
    ``defs``, every field a literal or an expression)."""
    tools: list[dict[str, Any]] = []
    maps: list[dict[str, Any]] = []
    for name in registry.names():
        item = registry.get(name)
        tool_input = _hoist(item.input_model.model_json_schema(), f"{name}__", defs)
        tool_input.pop("title", None)
        for key, value in list(tool_input.get("properties", {}).items()):
            tool_input["properties"][key] = {"anyOf": [value, {"$ref": "#/$defs/expr"}]}
        defs[f"input__{name}"] = tool_input
        defs[f"tool__{name}"] = {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "tool", "input"],
            "properties": {
                "id": step_id,
                "tool": {"type": "string", "enum": [name]},
                "input": {"$ref": f"#/$defs/input__{name}"},
                **flow,
            },
        }
        tools.append({"$ref": f"#/$defs/tool__{name}"})
        maps.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "id", "over", "max_items", "tool", "input"],
                "properties": {
                    "kind": {"type": "string", "enum": ["map"]},
                    "id": step_id,
                    "over": {"type": "string", "minLength": 1, "maxLength": 300},
                    "max_items": {"type": "integer", "minimum": 1, "maximum": max_items},
                    "max_parallel": {"type": "integer", "minimum": 1, "maximum": 8},
                    "tool": {"type": "string", "enum": [name]},
                    "input": {"$ref": f"#/$defs/input__{name}"},
                    **flow,
                },
            }
        )
    return tools, maps


def _composite_steps(
    tools: list[dict[str, Any]],
    step_id: dict[str, Any],
    flow: dict[str, Any],
    max_iterations: int,
    max_body_steps: int,
) -> list[dict[str, Any]]:
    """The loop and sub-plan steps: a body of tool steps (nothing nests further)."""
    body = {
        "type": "array",
        "minItems": 1,
        "maxItems": max_body_steps,
        "items": {"anyOf": tools} if len(tools) > 1 else tools[0],
    }
    nested: dict[str, dict[str, Any]] = {
        "loop": {
            "required": ["kind", "id", "steps", "max_iterations"],
            "properties": {
                "until": {"type": "string", "minLength": 1, "maxLength": 300},
                "max_iterations": {"type": "integer", "minimum": 1, "maximum": max_iterations},
            },
        },
        "subplan": {"required": ["kind", "id", "steps"], "properties": {}},
    }
    return [
        {
            "type": "object",
            "additionalProperties": False,
            "required": shape["required"],
            "properties": {
                "kind": {"type": "string", "enum": [kind]},
                "id": step_id,
                "steps": body,
                "inputs": {
                    "type": "object",
                    "maxProperties": 8,
                    "additionalProperties": {"$ref": "#/$defs/expr"},
                },
                **shape["properties"],
                **flow,
            },
        }
        for kind, shape in nested.items()
    ]


def plan_answer_schema(
    registry: ToolRegistry,
    *,
    max_steps: int = 8,
    max_items: int = 50,
    max_iterations: int = 5,
    max_body_steps: int = 4,
) -> dict[str, Any]:
    """The JSON Schema a model's plan must follow: a goal, optional plan inputs and failure
    mode, and steps (arrays and strings bounded, as small models need).

    A step calls one tool of ``registry`` with that tool's input, each field a literal or an
    expression (``{"$expr": ...}``); it may depend on earlier steps, run only ``when`` a condition
    holds, run on a dependency's failure (``runs_on``) and have a ``priority``. A ``map`` step
    runs one tool per item of a list (``over``; its input reads ``item``), at most ``max_items``
    items; a ``loop`` repeats a body of at most ``max_body_steps`` tool steps ``until`` a
    condition holds, at most ``max_iterations`` times (required); a ``subplan`` runs such a body
    once. Bodies hold tool steps only: nothing nests further.

    Raises:
        ValueError: The registry has no tool (a model could write no step).
    """
    if not registry.names():
        raise ValueError(f"the {registry.agent} agent has no tool a model's plan could call")
    defs: dict[str, Any] = {"expr": _EXPRESSION}
    step_id = {"type": "string", "pattern": f"^{STEP_ID_PATTERN}$", "maxLength": 64}
    flow = _flow(step_id, max_steps)
    tools, maps = _tool_steps(registry, defs, step_id, flow, max_items)
    composites = _composite_steps(tools, step_id, flow, max_iterations, max_body_steps)
    inputs = {"type": "object", "maxProperties": 8, "additionalProperties": _INPUT_VALUE}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["goal", "steps"],
        "properties": {
            "goal": {"type": "string", "minLength": 1, "maxLength": 300},
            "inputs": inputs,
            "on_failure": {"type": "string", "enum": ["fail_fast", "continue_independent"]},
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_steps,
                "items": {"anyOf": [*tools, *maps, *composites]},
            },
        },
        "$defs": defs,
    }
