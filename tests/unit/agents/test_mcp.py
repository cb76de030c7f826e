"""MCP tools' types and facts, without a server: schemas, annotations, the policy, settings."""

from __future__ import annotations

from typing import Any

import pytest
from mcp_types import ToolAnnotations
from pydantic import ValidationError

from stratagem.agents import (
    McpResult,
    Tool,
    ToolRegistry,
    json_schema_model,
    plan_answer_schema,
    tool_effects,
)
from stratagem.planning import LogicError, ToolContext
from stratagem.protocol import McpServerConfig, Policy
from stratagem.runtime._settings import Settings

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "minLength": 1}, "limit": {"type": "integer"}},
    "required": ["path"],
    "additionalProperties": False,
}


def test_a_json_schema_model_validates_and_gives_its_schema_back() -> None:
    model = json_schema_model("ReadInput", SCHEMA)
    assert model.model_validate({"path": "a", "limit": 3}).model_dump() == {"path": "a", "limit": 3}
    assert model.model_json_schema() == SCHEMA
    with pytest.raises(ValidationError, match=r"limit: 'x' is not of type 'integer'"):
        model.model_validate({"path": "a", "limit": "x"})
    with pytest.raises(ValidationError, match=r"'path' is a required property"):
        model.model_validate({})
    with pytest.raises(ValidationError, match="Additional properties"):
        model.model_validate({"path": "a", "other": 1})


def test_a_schema_that_is_not_one_or_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        json_schema_model("Bad", {"type": "object", "minLength": "x"})
    with pytest.raises(ValueError, match="not an object"):
        json_schema_model("Bad", {"type": "string"})


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, (True, False)),
        (ToolAnnotations(), (True, False)),
        (ToolAnnotations(read_only_hint=True), (False, True)),
        (ToolAnnotations(read_only_hint=False, idempotent_hint=True), (True, True)),
        (ToolAnnotations(destructive_hint=True), (True, False)),
        (ToolAnnotations(destructive_hint=True, idempotent_hint=True), (True, True)),
        (ToolAnnotations(read_only_hint=True, destructive_hint=True), (True, False)),
    ],
)
def test_annotations_map_onto_side_effects_and_idempotent(
    annotations: ToolAnnotations | None, expected: tuple[bool, bool]
) -> None:
    assert tool_effects(annotations) == expected


def test_untrusted_annotations_make_every_tool_side_effecting() -> None:
    assert tool_effects(ToolAnnotations(read_only_hint=True), trusted=False) == (True, False)


def _schema_tool(name: str) -> Tool[Any, Any]:
    async def run(data: Any, ctx: ToolContext) -> dict[str, Any]:
        return {"text": data.model_dump()["path"]}

    return Tool(
        name=name,
        description="read",
        input_model=json_schema_model("FilesReadInput", SCHEMA),
        output_model=McpResult,
        fn=run,
    )


def test_the_model_planners_answer_schema_carries_an_mcp_tools_schema() -> None:
    registry = ToolRegistry("tactical")
    registry.register(_schema_tool("files.read"))
    schema = plan_answer_schema(registry)
    step = schema["properties"]["steps"]["items"]
    assert step["properties"]["tool"] == {"type": "string", "enum": ["files.read"]}
    assert step["properties"]["input"]["properties"] == SCHEMA["properties"]
    assert step["properties"]["input"]["required"] == ["path"]


async def test_the_registry_refuses_input_that_breaks_the_schema_in_one_line() -> None:
    registry = ToolRegistry("tactical")
    registry.register(_schema_tool("files.read"))
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    assert (await registry.run_tool("files.read", {"path": "x"}, ctx))["text"] == "x"
    with pytest.raises(LogicError) as refused:
        await registry.run_tool("files.read", {"path": ""}, ctx)
    assert str(refused.value) == ("tool 'files.read': invalid input: path: '' should be non-empty")


def test_the_policy_allows_mcp_tools_only_by_rules_naming_the_server() -> None:
    policy = Policy.from_toml(
        '[[allow]]\ncaller = "tactical"\ntarget = "mcp.files"\ncapabilities = ["read"]\n'
        '[[allow]]\ncaller = "*"\ntarget = "mcp.web"\ncapabilities = ["*"]\n'
        '[[allow]]\ncaller = "tactical"\ntarget = "*"\ncapabilities = ["*"]\n'
    )
    assert policy.allows_tool("tactical", "files", "read")
    assert not policy.allows_tool("tactical", "files", "write")
    assert not policy.allows_tool("perception", "files", "read")
    assert policy.allows_tool("perception", "web", "fetch")
    assert not policy.allows_tool("tactical", "db", "query")  # a "*" target is not an MCP server
    assert not Policy.default().allows_tool("tactical", "files", "read")


def test_a_server_config_names_one_transport() -> None:
    with pytest.raises(ValidationError, match="either command"):
        McpServerConfig(agent="tactical")
    with pytest.raises(ValidationError, match="either command"):
        McpServerConfig(agent="tactical", command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValidationError, match="http"):
        McpServerConfig(agent="tactical", url="ftp://x")
    with pytest.raises(ValidationError, match="headers are for a url server"):
        McpServerConfig(agent="tactical", command="x", headers={"a": "b"})
    secret = McpServerConfig(agent="tactical", url="http://h/mcp", headers={"Authorization": "k"})
    assert "Authorization" not in repr(secret)


def test_settings_take_mcp_servers_and_faces_and_check_their_names() -> None:
    settings = Settings(
        mcp_servers={"files": {"agent": "tactical", "command": "mcp-files"}},
        mcp_ports={"tactical": 0},
    )
    assert settings.mcp_servers["files"].transport == "stdio"
    assert Settings.model_validate_json(settings.model_dump_json()) == settings
    with pytest.raises(ValidationError, match="must match"):
        Settings(mcp_servers={"Files!": {"agent": "tactical", "command": "x"}})
    with pytest.raises(ValidationError, match=r"0\.\.65535"):
        Settings(mcp_ports={"tactical": 70000})
    assert ("mcp_servers", "nobody") in Settings(
        mcp_servers={"x": {"agent": "nobody", "command": "x"}}
    ).unknown_roles(["tactical"])
