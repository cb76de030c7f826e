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
from stratagem.runtime.config._settings import Settings

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
    step = schema["$defs"]["tool__files.read"]
    assert step["properties"]["tool"] == {"type": "string", "enum": ["files.read"]}
    tool_input = schema["$defs"]["input__files.read"]
    # each field: the tool's own schema, or an expression
    assert {name: field["anyOf"][0] for name, field in tool_input["properties"].items()} == SCHEMA[
        "properties"
    ]
    assert tool_input["required"] == ["path"]


async def test_the_registry_refuses_input_that_breaks_the_schema_in_one_line() -> None:
    registry = ToolRegistry("tactical")
    registry.register(_schema_tool("files.read"))
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    assert (await registry.run_tool("files.read", {"path": "x"}, ctx))["text"] == "x"
    with pytest.raises(LogicError) as refused:
        await registry.run_tool("files.read", {"path": ""}, ctx)
    # One line naming the tool and the field; the reason's wording is jsonschema's own and varies
    # between its versions ("should be non-empty", "is too short").
    message = str(refused.value)
    assert message.startswith("tool 'files.read': invalid input: path: '' ")
    assert "\n" not in message


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


def test_a_stdio_server_may_not_run_in_the_state_directory(tmp_path: Any) -> None:
    from pydantic_settings import SettingsError

    from stratagem.runtime.config._settings import load_settings

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for cwd in (state, state / "servers"):
        servers = {"files": {"agent": "tactical", "command": "mcp-files", "cwd": str(cwd)}}
        with pytest.raises(SettingsError, match=r"^mcp_servers\.files\.cwd: .* state directory"):
            load_settings(state_dir=state, mcp_servers=servers)
    servers = {"files": {"agent": "tactical", "command": "mcp-files", "cwd": str(tmp_path)}}
    assert load_settings(state_dir=state, mcp_servers=servers).mcp_servers["files"].cwd


def test_a_servers_standard_error_passes_within_its_budget_and_the_rest_is_counted() -> None:
    from stratagem.agents._mcp._transport import _StderrBudget

    now = [0.0]
    budget = _StderrBudget("server 'x'", limit=10, window_s=60.0, clock=lambda: now[0])
    assert budget.admit(b"12345") == b"12345"
    assert budget.admit(b"67890abc") == b"67890"
    assert budget.admit(b"d" * 1000) == b""
    now[0] = 61.0  # a new window: the note of what the last one dropped, then the output
    passed = budget.admit(b"next")
    assert passed.endswith(b"next")
    assert b"1003 bytes dropped" in passed
    assert budget.flush() == b""
