"""Where the perception agent's worlds are kept across restarts: the ``WorldStore`` protocol and
its stores.

A store keeps one snapshot per named world. ``FileWorldStore`` (here) keeps the ``default`` world
in one JSON file of the state directory (``perception.world.json``, where it always was) and every
other world in a file of its own in a folder beside it (``perception.worlds/<name>.json``);
``PostgresWorldStore`` (``_postgres``) keeps them in rows of the agent's PostgreSQL schema, so an
agent that moves to another node keeps its worlds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from stratagem.protocol import DEFAULT_WORLD, WORLD_PATTERN

__all__ = ["FileWorldStore", "WorldStore"]

_NAME: Final = re.compile(WORLD_PATTERN)


class WorldStore(Protocol):
    """Where named worlds are kept across restarts."""

    def load(self, world: str = DEFAULT_WORLD) -> dict[str, Any] | None:
        """The last snapshot saved of ``world``, or ``None`` when none was."""

    def save(self, snapshot: Mapping[str, Any], world: str = DEFAULT_WORLD) -> None:
        """Keep ``snapshot`` of ``world`` durably (it replaces the previous one); blocks until it
        is."""

    def names(self) -> list[str]:
        """Every world a snapshot was saved of, by name."""


class FileWorldStore:
    """World snapshots in JSON files, each replaced atomically and fsynced on every save.

    Args:
        path: The ``default`` world's file (its folder is created when missing); the other worlds
            go in the folder ``<stem>.worlds`` beside it (``perception.world.json``:
            ``perception.worlds/``).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.folder = self.path.with_name(self.path.stem.removesuffix(".world") + ".worlds")

    def _file(self, world: str) -> Path:
        if world == DEFAULT_WORLD:
            return self.path
        if not _NAME.fullmatch(world):
            raise ValueError(f"{world!r} is not a world name")
        return self.folder / f"{world}.json"

    def load(self, world: str = DEFAULT_WORLD) -> dict[str, Any] | None:
        path = self._file(world)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a world snapshot")
        return data

    def save(self, snapshot: Mapping[str, Any], world: str = DEFAULT_WORLD) -> None:
        path = self._file(world)
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(".tmp")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(snapshot, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power loss
        finally:
            os.close(dir_fd)

    def names(self) -> list[str]:
        found = {DEFAULT_WORLD} if self.path.exists() else set()
        if self.folder.is_dir():
            found.update(
                path.stem
                for path in self.folder.glob("*.json")
                if _NAME.fullmatch(path.stem) and path.stem != DEFAULT_WORLD
            )
        return sorted(found)
