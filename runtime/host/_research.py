"""The perception agent's research tools, bound to the deployment's cache and file scopes."""

from __future__ import annotations

from typing import Any

from stratagem.agents import Agent, MemoryStore, Tool
from stratagem.agents.research import (
    DirectorySourceCache,
    FetchLedger,
    FileScopes,
    KnowledgeBase,
    research_tools,
)
from stratagem.runtime.config._settings import Settings

__all__ = ["bind_research_tools"]


def bind_research_tools(
    agent: Agent, settings: Settings, memory: MemoryStore
) -> list[Tool[Any, Any]]:
    """Replace the agent's research tools (which read nothing) with ones that read within
    ``settings.research_roots``, cache under ``settings.research_dir`` and keep their claims in
    the knowledge base in the deployment's memory; the tools bound."""
    folder = settings.research_dir
    bound = research_tools(
        DirectorySourceCache(folder / "blobs"),
        FetchLedger(folder / "fetched"),
        FileScopes.of(settings.research_roots),
        KnowledgeBase(memory),
    )
    for item in bound:
        agent.registry.register(item, replace=True)
    return bound
