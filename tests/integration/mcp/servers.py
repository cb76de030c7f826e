"""A real MCP server for the tests, made with the ``mcp`` SDK's low-level ``Server``.

Run as ``python servers.py stdio`` (over stdin/stdout) or ``python servers.py http PORT``
(Streamable HTTP on 127.0.0.1). ``MCP_TEST_STATE`` names a folder where the tools leave their
traces (how often they ran), so a test can tell whether a call reached the server.

``MCP_TEST_BROKEN=schema`` makes ``tools/list`` answer a tool whose input schema is not a JSON
Schema (its tools do not load).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

STATE = Path(os.environ.get("MCP_TEST_STATE", "."))

_NUMBER_PAIR = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
_TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 200}},
    "required": ["text"],
}
_SUM = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
}
_READ_ONLY = types.ToolAnnotations(read_only_hint=True)
_IDEMPOTENT_WRITE = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True
)

TOOLS = [
    types.Tool(
        name="add",
        description="Add two integers.",
        input_schema=_NUMBER_PAIR,
        output_schema=_SUM,
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="echo", description="Say the text back.", input_schema=_TEXT, annotations=_READ_ONLY
    ),
    types.Tool(
        name="append_note",
        description="Append a note to the notebook (unannotated: side effects).",
        input_schema=_TEXT,
    ),
    types.Tool(
        name="set_flag",
        description="Set a flag (destructive but idempotent).",
        input_schema=_TEXT,
        annotations=_IDEMPOTENT_WRITE,
    ),
    types.Tool(
        name="crash_once",
        description="Exit the server the first time, answer afterwards.",
        input_schema={"type": "object", "properties": {}},
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="crash_note",
        description="Write a note, then exit the server (unannotated).",
        input_schema=_TEXT,
    ),
    types.Tool(
        name="hang_once",
        description="Hang the first time, answer afterwards.",
        input_schema={"type": "object", "properties": {}},
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="flood",
        description="Answer a text of n bytes.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0}},
            "required": ["n"],
        },
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="bad_sum",
        description="Declares a sum, answers something else.",
        input_schema=_NUMBER_PAIR,
        output_schema=_SUM,
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="where",
        description="Say where the server runs and what of the agent's it can see.",
        input_schema={"type": "object", "properties": {}},
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="shout",
        description="Write n bytes to standard error, then answer.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0}},
            "required": ["n"],
        },
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="greedy",
        description="Answers n a's and a '!' where its outputSchema's pattern backtracks badly.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0}},
            "required": ["n"],
        },
        output_schema={
            "type": "object",
            "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}},
            "required": ["word"],
        },
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="fail",
        description="Answer isError.",
        input_schema={"type": "object", "properties": {}},
        annotations=_READ_ONLY,
    ),
]


def _count(name: str) -> int:
    """Count one run of ``name`` in the state folder; the count after this run."""
    path = STATE / f"{name}.count"
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


def _text(text: str, structured: Any = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured
    )


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    if os.environ.get("MCP_TEST_BROKEN") == "schema":
        broken = types.Tool(name="broken", input_schema={"type": "object", "minLength": "x"})
        return types.ListToolsResult(tools=[broken])
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name
    _count(name)
    if name == "add":
        total = args["a"] + args["b"]
        return _text(str(total), {"sum": total})
    if name == "echo":
        return _text(args["text"])
    if name in ("append_note", "set_flag"):
        with (STATE / f"{name}.txt").open("a") as notes:
            notes.write(args["text"] + "\n")
        return _text("noted")
    if name == "crash_once":
        marker = STATE / "crashed"
        if not marker.exists():
            marker.write_text("1")
            os._exit(3)
        return _text("back")
    if name == "crash_note":
        with (STATE / "crash_note.txt").open("a") as notes:
            notes.write(args["text"] + "\n")
        os._exit(3)
    if name == "hang_once":
        marker = STATE / "hung"
        if not marker.exists():
            marker.write_text("1")
            await asyncio.sleep(3600)
        return _text("awake")
    if name == "flood":
        return _text("x" * int(args["n"]))
    if name == "where":
        seen = {
            "cwd": os.getcwd(),
            "files": sorted(os.listdir(".")),
            "env": sorted(k for k in os.environ if k.startswith(("STRATAGEM_", "RAY_"))),
        }
        return _text(str(seen), seen)
    if name == "shout":
        line = b"e" * 1023 + b"\n"
        for _ in range(int(args["n"]) // 1024):
            sys.stderr.buffer.write(line)
        sys.stderr.flush()
        return _text("shouted")
    if name == "bad_sum":
        return _text("many", {"sum": "many"})
    if name == "greedy":
        word = "a" * int(args["n"]) + "!"
        return _text(word, {"word": word})
    if name == "fail":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="no such file:\n/tmp/nothing")],
            is_error=True,
        )
    raise ValueError(f"unknown tool {name}")


server = Server("stratagem-test", on_list_tools=list_tools, on_call_tool=call_tool)


async def _stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    (STATE / f"started.{os.getpid()}").write_text(str(time.time()))
    if sys.argv[1] == "stdio":
        asyncio.run(_stdio())
        return
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")


if __name__ == "__main__":
    main()
