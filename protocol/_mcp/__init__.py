"""The Model Context Protocol at the edges of an agent.

``McpServerConfig`` (``_config``) says how an agent reaches an MCP server whose tools it gets
(``agents.McpToolset`` is the client); ``McpFace`` (``_face``) serves an agent's capabilities
as MCP tools to MCP clients, through the same pipeline stages as a gRPC ``Call``.
"""

from stratagem.protocol._mcp._config import MCP_SERVER_NAME_PATTERN, McpServerConfig

__all__ = ["MCP_SERVER_NAME_PATTERN", "McpServerConfig"]
