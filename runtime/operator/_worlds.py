"""The operator's part for the perception agent's worlds: list them, show one, reset one."""

from __future__ import annotations

import re

from stratagem.protocol import (
    WORLD_PATTERN,
    ListWorldsResponse,
    ResetWorldResponse,
    ShowWorldResponse,
)
from stratagem.runtime.operator._agents import Agents
from stratagem.runtime.operator._input import InputError

__all__ = ["Worlds"]


class Worlds:
    """The worlds, through ``agents`` (the perception agent's capabilities)."""

    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    async def worlds(self, *, prefix: str = "") -> ListWorldsResponse:
        """The perception agent's worlds (those whose name starts with ``prefix``), by name, with
        their versions and sizes."""
        answer = await self._agents.call("perception", "ListWorlds", {"prefix": prefix})
        assert isinstance(answer, ListWorldsResponse)
        return answer

    async def _known_world(self, world: str) -> None:
        """Raises ``InputError`` unless ``world`` is a world's name and that world exists."""
        if not re.fullmatch(WORLD_PATTERN, world):
            raise InputError(
                f"world name {world!r} is not valid: a lowercase letter or digit, then up to 63 "
                "lowercase letters, digits, '_', '.' or '-'"
            )
        listed = await self.worlds(prefix=world)
        if all(summary.name != world for summary in listed.worlds):
            everyone = await self.worlds()
            names = [summary.name for summary in everyone.worlds][:10]
            more = everyone.total - len(names)
            raise InputError(
                f"no world {world!r}; worlds: {', '.join(names) or 'none yet'}"
                + (f" and {more} more" if more > 0 else "")
                + " ('stratagem world list')"
            )

    async def world(self, world: str) -> ShowWorldResponse:
        """Every entity and fact of ``world``.

        Raises:
            InputError: A malformed name, or no world of that name (the worlds there are named).
        """
        await self._known_world(world)
        answer = await self._agents.call("perception", "ShowWorld", {"world": world})
        assert isinstance(answer, ShowWorldResponse)
        return answer

    async def reset_world(self, world: str) -> ResetWorldResponse:
        """Empty ``world`` (no entity, no fact; saved before this returns). Goals that name it
        start from nothing again.

        Raises:
            InputError: A malformed name, or no world of that name.
        """
        await self._known_world(world)
        answer = await self._agents.call("perception", "ResetWorld", {"world": world})
        assert isinstance(answer, ResetWorldResponse)
        return answer
