"""Where a world model is kept across restarts: the ``WorldStore`` protocol and its stores.

``FileWorldStore`` (here) keeps the snapshot in one JSON file of the state directory;
``PostgresWorldStore`` (``_postgres``) in a row of the agent's PostgreSQL schema, so an agent that
moves to another node keeps its world.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FileWorldStore", "WorldStore"]


class WorldStore(Protocol):
    """Where a world model is kept across restarts."""

    def load(self) -> dict[str, Any] | None:
        """The last snapshot saved, or ``None`` when none was."""

    def save(self, snapshot: Mapping[str, Any]) -> None:
        """Keep ``snapshot`` durably (it replaces the previous one); blocks until it is."""


class FileWorldStore:
    """A world snapshot in one JSON file, replaced atomically and fsynced on every save.

    Args:
        path: The file (its folder is created when missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"{self.path} does not hold a world snapshot")
        return data

    def save(self, snapshot: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.with_suffix(".tmp")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(snapshot, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power loss
        finally:
            os.close(dir_fd)
