"""``Worlds``: the named worlds one perception agent keeps, loaded and saved through its store."""

from __future__ import annotations

import asyncio

from stratagem.agents._world._model import WorldModel
from stratagem.agents._world._store import WorldStore
from stratagem.protocol import DEFAULT_WORLD

__all__ = ["Worlds"]


class Worlds:
    """The perception agent's named worlds: each loaded from the store on first use, and saved
    after each change, before the tool that made it returns (so before the engine records the
    step as done, and before any answer reports it). The one writer of the worlds' snapshots.

    Args:
        store: Where worlds are kept (``None``: in memory only).
        default: The ``default`` world to start from (else the stored one, else an empty one).
    """

    def __init__(self, store: WorldStore | None, default: WorldModel | None = None) -> None:
        self._store = store
        self._loaded: dict[str, WorldModel] = {}
        self._saved: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        if default is not None:
            self._loaded[DEFAULT_WORLD] = default
            self._saved[DEFAULT_WORLD] = default.version

    def get(self, name: str = "") -> WorldModel:
        """The world ``name`` (``""``: the default one), empty when it was never saved."""
        name = name or DEFAULT_WORLD
        world = self._loaded.get(name)
        if world is None:
            saved = self._store.load(name) if self._store is not None else None
            world = WorldModel.restore(saved) if saved is not None else WorldModel()
            self._loaded[name] = world
            self._saved[name] = world.version
        return world

    async def keep(self, name: str = "") -> None:
        """Save ``name``'s world if it changed since it was last saved."""
        name = name or DEFAULT_WORLD
        if self._store is None:
            return
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:  # one save at a time per world, each of the latest state
            world = self.get(name)
            if world.version == self._saved.get(name):
                return
            version = world.version
            await asyncio.to_thread(self._store.save, world.snapshot(), name)
            self._saved[name] = version

    def names(self) -> list[str]:
        """Every world saved or used, by name."""
        stored = self._store.names() if self._store is not None else []
        return sorted({*stored, *self._loaded})

    async def reset(self, name: str) -> tuple[WorldModel, int, int]:
        """Empty ``name``'s world and save it: the new world, and how many entities and facts
        it held. Its version goes on from the old one's."""
        old = self.get(name)
        fresh = WorldModel.restore({"version": old.version + 1})
        self._loaded[name] = fresh
        if self._store is not None:
            await asyncio.to_thread(self._store.save, fresh.snapshot(), name)
            self._saved[name] = fresh.version
        return fresh, len(old.entities), len(old.facts())
