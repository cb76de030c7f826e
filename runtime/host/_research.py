"""The perception agent's research tools, bound to the deployment's cache and file scopes."""

from __future__ import annotations

from typing import Any

from stratagem.agents import Agent, Tool
from stratagem.agents.research import (
    DirectorySourceCache,
    FetchLedger,
    FileScopes,
    research_tools,
)
from stratagem.runtime.config._settings import Settings

__all__ = ["bind_research_tools"]


def bind_research_tools(agent: Agent, settings: Settings) -> list[Tool[Any, Any]]:
    """Replace the agent's research tools (which read nothing) with ones that read within
    ``settings.research_roots`` and cache under ``settings.research_dir``; the tools bound."""
    folder = settings.research_dir
    bound = research_tools(
        DirectorySourceCache(folder / "blobs"),
        FetchLedger(folder / "fetched"),
        FileScopes.of(settings.research_roots),
    )
    for item in bound:
        agent.registry.register(item, replace=True)
    return bound
