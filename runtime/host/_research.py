"""The research tools (the perception agent's) bound to the deployment's cache, file scopes and
knowledge base, and the ``hypotheses.*`` tools every agent's plans may use."""

from __future__ import annotations

from typing import Any

from stratagem.agents import Agent, MemoryStore, ModelClient, PolicedMemory, Tool
from stratagem.agents.research import (
    DirectorySourceCache,
    FetchLedger,
    FileScopes,
    KnowledgeBase,
    ModelResearcher,
    ToolCaller,
    hypothesis_tools,
    research_tools,
)
from stratagem.planning import PolicyError, ToolContext
from stratagem.protocol import AuditLog, Policy
from stratagem.runtime.config._settings import Settings

__all__ = ["bind_research_tools"]


def _approved_tools_refused(agent: Agent, policy: Policy | None) -> ToolCaller:
    """The agent's tools by name, refusing those the policy asks an approval for (a research
    step is never held at a tool gate, so it does not call them)."""
    asked = {rule.tool for rule in policy.approvals(agent.role)} if policy else set()

    async def call(name: str, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if name in asked:
            raise PolicyError(f"{name} asks an approval ([[approval]]): research does not call it")
        return await agent.registry.run_tool(name, arguments, ctx)

    return call


def bind_research_tools(
    agent: Agent,
    settings: Settings,
    memory: MemoryStore,
    policy: Policy | None = None,
    model: ModelClient | None = None,
    audit: AuditLog | None = None,
) -> list[Tool[Any, Any]]:
    """Give the agent the ``hypotheses.*`` tools (investigations in the deployment's memory,
    postmortems cached under ``settings.research_dir``) and, on the perception agent, replace its
    research tools (which read nothing) with ones that read within ``settings.research_roots``,
    cache there and keep their claims in the knowledge base, and have ``model`` (the agent's when
    it plans with one) write the sub-questions and a synthesis; the tools bound."""
    folder = settings.research_dir
    cache = DirectorySourceCache(folder / "blobs")
    # Under the policy ([[memory]]: each agent its own agent/<role>), each write audited.
    kept = PolicedMemory(memory, policy, agent.role, audit) if policy is not None else memory
    bound = hypothesis_tools(kept, cache, role=agent.role)
    if agent.role == "perception":
        bound += research_tools(
            cache,
            FetchLedger(folder / "fetched"),
            FileScopes.of(settings.research_roots),
            KnowledgeBase(kept),
            model=ModelResearcher(model) if model is not None else None,
            call_tool=_approved_tools_refused(agent, policy),  # an MCP source: server.tool
        )
    for item in bound:
        agent.registry.register(item, replace=True)
    return bound
