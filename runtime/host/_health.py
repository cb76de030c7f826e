"""What an agent checks about its own storage, so that ``status`` reports a broken store instead
of an agent that says it serves while its plans are gone or every write fails.

Three problems are looked for, when the agent starts and each time it is asked for its ``info``
(and the first before every write RPC: an agent whose plan store is gone accepts no work,
``refusal``):

- its SQLite plan store is missing, or is not the file it opened (the file's device and inode);
- after a restart, the plan store is not the one the agent used before: the store carries an id
  (a table of its own in the database) that is also kept beside it in ``<role>.plans.marker``
  with the number of plans the agent held, so a deleted store recreated empty is noticed instead
  of an agent that silently remembers no plans. Deleting the marker accepts the new store;
- its state directory is not writable (a probe file, one of its own per probe, cannot be
  created there), where answers, audit records and plans are written;
- after a restart, its world snapshot (``<role>.world.json``, the perception agent's facts) is
  gone although the marker says one was saved: the facts the agent's answers and plans rely on
  are lost, which it says instead of serving from an empty world as if nothing happened. Deleting
  the marker accepts the empty world.

A PostgreSQL store (``STRATAGEM_STORE_URL``) is not watched here: its own errors reach callers.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
import uuid
from pathlib import Path

from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._statedir import write_private

__all__ = ["StoreWatch"]

_TABLE = "stratagem_store_identity"


class StoreWatch:
    """Remembers which plan store ``role``'s agent opened and finds what went wrong since.

    Create it once the store is open, before the agent resumes its plans.

    Args:
        settings: The deployment's settings.
        role: The agent's role.
    """

    def __init__(self, settings: Settings, role: str, world: Path | None = None) -> None:
        self._state_dir = settings.state_dir
        self._world = world
        self._world_saved = False
        self._world_lost = ""
        self._plans: Path | None = None
        self._identity: tuple[int, int] | None = None
        self._marker = settings.state_dir / f"{role}.plans.marker"
        self._store_id = ""
        self._known = 0
        self._replaced = ""
        if settings.store_url is not None:
            return
        self._plans = settings.plans_path(role)
        self._identity = _identity(self._plans)
        try:
            self._store_id = _store_id(self._plans)
            marker = json.loads(self._marker.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self._write_marker(0)
            return
        except (OSError, ValueError, sqlite3.Error) as exc:
            self._replaced = f"plan store unreadable: {self._plans} ({exc})"
            return
        self._known = int(marker.get("plans", 0))
        self._world_saved = bool(marker.get("world", False))
        if self._world_saved and self._world is not None and not self._world.exists():
            self._world_lost = (
                f"world snapshot missing: {self._world} was deleted after the agent saved its "
                f"world (the facts it held are lost; restore the file, or delete {self._marker} "
                "to accept an empty world)"
            )
        if marker.get("store") != self._store_id:
            self._replaced = (
                f"plan store missing: {self._plans} was deleted after {self._known} plans were "
                f"written (this one is new and empty; delete {self._marker} to accept it)"
            )

    @property
    def world_lost(self) -> bool:
        """The world snapshot was deleted since the agent last saved it (seen at start)."""
        return bool(self._world_lost)

    def set_aside(self, answers: Path) -> None:
        """Move the answer store (and its WAL files) aside, named in the problem reported, so
        the calls whose effects were lost run again instead of being answered from it."""
        moved = answers.with_name(f"{answers.name}.lost-world-{uuid.uuid4().hex[:8]}")
        for suffix in ("", "-wal", "-shm"):
            source = answers.with_name(answers.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                source.rename(moved.with_name(moved.name + suffix))
        self._world_lost += f"; its stored answers were set aside to {moved.name}"

    def refusal(self) -> str:
        """Why the agent must accept no work now (``""`` when it may): the plan store it opened
        was deleted or replaced, so a plan written now would go to a file no restart reads (one
        stat; the server asks before every write RPC)."""
        if self._plans is None or self._identity is None:
            return ""
        now = _identity(self._plans)
        if now == self._identity:
            return ""
        what = "deleted" if now is None else "replaced"
        return (
            f"the plan store {self._plans} was {what} while the agent ran: it accepts no work "
            "until it is redeployed ('stratagem up --replace'), so that no plan is lost"
        )

    def problems(self, plans_written: int) -> list[str]:
        """What is wrong with the agent's storage now, one line each (empty: nothing).

        Args:
            plans_written: How many plans the agent remembers (kept in the marker, and said in
                the message).
        """
        found: list[str] = [p for p in (self._replaced, self._world_lost) if p]
        if self._plans is not None and self._identity is not None and not self._replaced:
            now = _identity(self._plans)
            if now is None:
                found.append(
                    f"plan store missing: {self._plans} was deleted after {plans_written} plans "
                    "were written"
                )
            elif now != self._identity:
                found.append(
                    f"plan store replaced: {self._plans} is not the file this agent opened "
                    f"(deleted and recreated after {plans_written} plans were written)"
                )
            elif plans_written != self._known or self._world_appeared():
                self._write_marker(plans_written)
        try:
            # A file of its own per probe (made with O_EXCL, or without a name at all), removed
            # when closed: probes run concurrently, from threads and from the agents sharing
            # this state dir, and a name they shared was deleted under one by another.
            with tempfile.TemporaryFile(dir=self._state_dir, prefix=".probe-"):
                pass
        except OSError as exc:
            found.append(f"state dir not writable: {self._state_dir} ({exc.strerror})")
        return found

    def _write_marker(self, plans: int) -> None:
        try:
            world = self._world_saved or (self._world is not None and self._world.exists())
            write_private(
                self._marker,
                json.dumps({"store": self._store_id, "plans": plans, "world": world}),
            )
        except OSError:
            return  # reported by the state dir probe
        self._known = plans
        self._world_saved = world

    def _world_appeared(self) -> bool:
        """The world snapshot exists now and the marker does not say so yet."""
        return not self._world_saved and self._world is not None and self._world.exists()


def _store_id(path: Path) -> str:
    """The id kept in the store's own table, made on first use."""
    with contextlib.closing(sqlite3.connect(path, timeout=10, isolation_level=None)) as db:
        db.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (id TEXT NOT NULL)")
        row = db.execute(f"SELECT id FROM {_TABLE}").fetchone()
        if row is not None:
            return str(row[0])
        made = uuid.uuid4().hex
        db.execute(f"INSERT INTO {_TABLE} (id) VALUES (?)", (made,))
        return made


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino
