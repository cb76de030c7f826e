"""Wiring memory into an agent actor: the deployment's memory store and the ``memory.*`` tools the
policy grants the agent (``agents._memory._tools``), its writes audited in the deployment's audit
log."""

from __future__ import annotations

import logging

from stratagem.agents import Agent, MemoryStore, PolicedMemory, memory_tools
from stratagem.protocol import AuditLog, Policy
from stratagem.runtime.config._memory import open_memory_store
from stratagem.runtime.config._settings import Settings

__all__ = ["attach_memory"]

logger = logging.getLogger(__name__)


async def attach_memory(
    agent: Agent, settings: Settings, policy: Policy, audit: AuditLog | None
) -> MemoryStore | None:
    """Open the deployment's memory and register on ``agent`` the memory tools the policy grants
    it; the store, for the actor to close. ``None``, nothing opened, when no ``[[memory]]`` rule
    grants the agent anything (the shipped policy's case)."""
    if not any(rule.caller in (agent.role, "*") for rule in policy.memory_rules):
        return None
    store = await open_memory_store(settings)
    tools = memory_tools(PolicedMemory(store, policy, agent.role, audit))
    for item in tools:
        agent.registry.register(item, replace=True)
    logger.info("agent %s: memory tools %s", agent.role, [item.name for item in tools])
    return store
