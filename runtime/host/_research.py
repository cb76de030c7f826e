"""The research tools (the perception agent's) bound to the deployment's cache, file scopes and
knowledge base, and the ``hypotheses.*`` tools of the agents the policy grants their memory."""

from __future__ import annotations

from typing import Any

from stratagem.agents import Agent, MemoryStore, ModelClient, PolicedMemory, Tool
from stratagem.agents.research import (
    KB_NAMESPACE,
    ArtifactSourceCache,
    DirectorySourceCache,
    FetchLedger,
    FileScopes,
    KnowledgeBase,
    ModelResearcher,
    SourceCache,
    ToolCaller,
    hypothesis_tools,
    research_tools,
)
from stratagem.agents.research._tracking import HYPOTHESES
from stratagem.planning import ArtifactStore, PolicyError, ToolContext
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
    memory: MemoryStore | None,
    policy: Policy | None = None,
    model: ModelClient | None = None,
    audit: AuditLog | None = None,
    artifacts: ArtifactStore | None = None,
) -> list[Tool[Any, Any]]:
    """Bind the research tools as the policy allows; the tools bound.

    On the perception agent, its research tools (which read nothing) are replaced with ones that
    read within ``settings.research_roots``, cache each source in ``artifacts`` (the agent's
    artifact store: an artifact of the research plan, its provenance the step that read it;
    without a store, content-addressed files under ``settings.research_dir``), call its MCP
    tools (never one that asks an approval) and have ``model`` (the agent's when it plans with
    one) write the sub-questions and a synthesis. Where the policy grants the agent its memory
    (``[[memory]]``: ``agent/perception/kb`` written, for the knowledge base; ``agent/<role>/
    hypotheses`` written, for the ``hypotheses.*`` tools), those are kept there through
    ``PolicedMemory`` (each write audited); the shipped policy grants agents no memory, so neither
    is on until a policy file says so (docs/research.md).
    """
    folder = settings.research_dir
    cache: SourceCache = (
        ArtifactSourceCache(artifacts, agent=agent.role)
        if artifacts is not None
        else DirectorySourceCache(folder / "blobs")
    )
    kept = PolicedMemory(memory, policy, agent.role, audit) if memory and policy else None
    bound: list[Tool[Any, Any]] = []
    hypotheses = ("agent", agent.role, HYPOTHESES)
    if kept is not None and kept.may("write", hypotheses) and kept.may("read", hypotheses):
        bound += hypothesis_tools(kept, cache, role=agent.role)
    if agent.role == "perception":
        kb_on = (
            kept is not None and kept.may("write", KB_NAMESPACE) and kept.may("read", KB_NAMESPACE)
        )
        bound += research_tools(
            cache,
            FetchLedger(folder / "fetched"),
            FileScopes.of(settings.research_roots),
            KnowledgeBase(kept) if kb_on and kept is not None else None,
            model=ModelResearcher(model) if model is not None else None,
            call_tool=_approved_tools_refused(agent, policy),  # an MCP source: server.tool
        )
    for item in bound:
        agent.registry.register(item, replace=True)
    return bound
