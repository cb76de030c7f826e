"""The research tools (the perception agent's) bound to the deployment's cache, file scopes and
knowledge base, and the ``hypotheses.*`` tools every agent's plans may use."""

from __future__ import annotations

from typing import Any

from stratagem.agents import Agent, MemoryStore, Tool
from stratagem.agents.research import (
    DirectorySourceCache,
    FetchLedger,
    FileScopes,
    KnowledgeBase,
    hypothesis_tools,
    research_tools,
)
from stratagem.runtime.config._settings import Settings

__all__ = ["bind_research_tools"]


def bind_research_tools(
    agent: Agent, settings: Settings, memory: MemoryStore
) -> list[Tool[Any, Any]]:
    """Give the agent the ``hypotheses.*`` tools (investigations in the deployment's memory,
    postmortems cached under ``settings.research_dir``) and, on the perception agent, replace its
    research tools (which read nothing) with ones that read within ``settings.research_roots``,
    cache there and keep their claims in the knowledge base; the tools bound."""
    folder = settings.research_dir
    cache = DirectorySourceCache(folder / "blobs")
    bound = hypothesis_tools(memory, cache)
    if agent.role == "perception":
        bound += research_tools(
            cache,
            FetchLedger(folder / "fetched"),
            FileScopes.of(settings.research_roots),
            KnowledgeBase(memory),
        )
    for item in bound:
        agent.registry.register(item, replace=True)
    return bound
