"""What a local deployment records in its state directory for both of the runtime's programs: the
Ray head ``stratagem up`` started (``local-ray.json``; ``host._local.LocalCluster`` starts, proves
and stops it) and each agent's published endpoint (``endpoints/<role>.json``: written by the agent
once it serves, read by the operator to reach it over gRPC without joining Ray; see
``host._local`` for what a record must be to be used). No Ray here, nor anything of ``host``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stratagem.runtime.config._errors import LaunchError
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._statedir import StateDirError, read_private, write_private

__all__ = [
    "ENDPOINTS_DIR",
    "PublishedAgent",
    "alive",
    "publish_endpoint",
    "published_endpoint",
    "published_path",
    "read_published",
    "recorded_head",
]

logger = logging.getLogger(__name__)

ENDPOINTS_DIR: Final = "endpoints"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie child of ours does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def published_path(state_dir: Path, role: str) -> Path:
    """Where ``role``'s agent publishes its endpoint."""
    return state_dir / ENDPOINTS_DIR / f"{role}.json"


def publish_endpoint(
    state_dir: Path, role: str, endpoint: str, pid: int, logs: Sequence[str] = ()
) -> None:
    """Record ``role``'s endpoint, process and log files (mode 0600, atomically: a reader sees
    the old or the new)."""
    record = {"endpoint": endpoint, "pid": pid, "logs": list(logs)}
    write_private(published_path(state_dir, role), json.dumps(record))


@dataclass(frozen=True, slots=True)
class PublishedAgent:
    """What an agent published in the state directory: its endpoint, process and log files."""

    endpoint: str
    pid: int
    logs: tuple[Path, ...]

    @property
    def alive(self) -> bool:
        """Whether its process runs (on this machine)."""
        return alive(self.pid)


def read_published(state_dir: Path, role: str) -> PublishedAgent | None:
    """What ``role``'s agent published here, its process alive or not (``None``: nothing)."""
    try:
        raw = json.loads(read_private(published_path(state_dir, role)))
        return PublishedAgent(
            endpoint=str(raw["endpoint"]),
            pid=int(raw["pid"]),
            logs=tuple(Path(str(p)) for p in raw.get("logs", [])),
        )
    except (OSError, ValueError, KeyError, TypeError, StateDirError):
        return None


def recorded_head(path: Path) -> tuple[str, int, int, str] | None:
    """The address, pid, start time and id of the Ray head ``stratagem up`` recorded at ``path``
    (``host._local.LocalCluster.recorded`` makes its ``LocalCluster`` of them), alive or not;
    ``None`` when none is recorded.

    Raises:
        LaunchError: The record is not a file of this user's that nobody else may read or
            write (a planted record is never followed).
    """
    try:
        raw = json.loads(read_private(path))
        return (
            str(raw["address"]),
            int(raw["pid"]),
            int(raw.get("started", 0)),
            str(raw.get("head_id", "")),
        )
    except StateDirError as exc:
        raise LaunchError(f"{exc}; delete it if 'stratagem up' did not write it") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def published_endpoint(settings: Settings, role: str) -> str | None:
    """``role``'s endpoint as its agent published it, when this machine's local deployment (the
    head ``stratagem up`` started) runs it in a live process; else ``None`` (ask Ray).

    Only a record of this user's that nobody else may read or write is used; the caller must
    still have the agent there prove that it holds the deployment's key before it sends a token
    (``protocol.prove_endpoint``).
    """
    if settings.address is not None:
        return None
    try:
        head = recorded_head(settings.local_cluster_file)
        if head is None or not alive(head[1]):
            return None
        raw = json.loads(read_private(published_path(settings.state_dir, role)))
        endpoint, pid = str(raw["endpoint"]), int(raw["pid"])
    except (LaunchError, StateDirError) as exc:
        logger.warning("not using %s's published endpoint: %s", role, exc)
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return endpoint if alive(pid) else None
