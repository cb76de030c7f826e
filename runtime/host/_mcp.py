"""Wiring MCP into an agent actor: the MCP servers whose tools it gets.

They are optional and configured in the settings: ``mcp_servers`` (each names the agent whose
registry gets its tools). The agent's own MCP face (``mcp_ports``) is one of its wire faces
(``runtime._faces``, ``protocol.FACES``). The policy decides which servers' tools an agent may
use (``Policy.allows_tool``); its calls to them are audited in the deployment's audit log. A
server whose tools do not load stops the agent from starting, and so ``stratagem up``, with one
line naming the server and why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stratagem.agents import Agent, McpLoadError, McpToolset
from stratagem.protocol import AuditLog, Policy
from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.config._settings import Settings

__all__ = ["McpSetupError", "attach_mcp_servers"]

logger = logging.getLogger(__name__)


class McpSetupError(StratagemRuntimeError):
    """An agent's MCP servers or one of its wire faces cannot be set up (one line; the agent does
    not start)."""


async def attach_mcp_servers(
    agent: Agent, settings: Settings, policy: Policy, audit: AuditLog | None
) -> list[McpToolset]:
    """Connect the MCP servers configured for ``agent`` and register the tools the policy allows.

    Raises:
        McpSetupError: A server's tools do not load; the servers already started are closed.
    """
    started: list[McpToolset] = []
    for name, config in sorted(settings.mcp_servers.items()):
        if config.agent != agent.role:
            continue
        toolset = McpToolset(name, config, allow=_allowed(policy, agent.role, name), audit=audit)
        try:
            tools = await toolset.start(agent.registry)
        except McpLoadError as exc:
            for other in started:
                await other.aclose()
            raise McpSetupError(f"agent {agent.role}: {exc}") from None
        if not tools:
            logger.warning(
                "agent %s: the policy allows none of MCP server %s's tools (add a rule with "
                "caller %r, target 'mcp.%s')",
                agent.role,
                name,
                agent.role,
                name,
            )
        started.append(toolset)
    return started


def _allowed(policy: Policy, role: str, server: str) -> Callable[[str], bool]:
    def allowed(tool: str) -> bool:
        return policy.allows_tool(role, server, tool)

    return allowed
