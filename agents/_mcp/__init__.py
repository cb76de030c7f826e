"""MCP servers as tools of an agent (the client side of the Model Context Protocol).

``protocol.McpServerConfig`` says how to reach a server and whose registry gets its tools;
``McpToolset`` connects, lists the tools and registers them (``<server>.<tool>``), typed by their
JSON Schemas (``json_schema_model``) and run inside the runtime's promises (see ``_toolset``).
"""

from stratagem.agents._mcp._schema import JsonSchemaModel, json_schema_model
from stratagem.agents._mcp._toolset import McpLoadError, McpResult, McpToolset, tool_effects

__all__ = [
    "JsonSchemaModel",
    "McpLoadError",
    "McpResult",
    "McpToolset",
    "json_schema_model",
    "tool_effects",
]
