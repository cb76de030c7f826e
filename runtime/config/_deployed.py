"""What ``stratagem up`` deployed, kept in the state directory for every later command.

``up`` writes ``STATE_DIR/deployment.json`` once its agents serve: the extensions it loaded into
them (file paths made absolute), the folders they import them from (``up`` adds the folder it
was run in), and how long each agent may take to plan one request (``planning_timeout_s``: what
a goal's default deadline is made of, so no command asks the agents for it). Every command that
reads settings for that state directory without an extension set of its own (no
``STRATAGEM_EXTENSIONS``, no profile value) takes the recorded one, so a shell that never exported
the variable still knows the agents an extension defines and their capabilities.
``down`` removes the record.

Extensions are code the CLI imports: a record is read only when it is a regular file owned by this
user and writable by nobody else (otherwise it is ignored, and the error logged), as the state
directory's other secrets are trusted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RECORD_FILE",
    "DeploymentRecord",
    "absolute_extensions",
    "read_record",
    "remove_record",
    "write_record",
]

logger = logging.getLogger(__name__)

RECORD_FILE = "deployment.json"
"""The record's name in the state directory."""


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """The extensions a deployment's agents load, and how each plans.

    Attributes:
        extensions: As ``STRATAGEM_EXTENSIONS`` names them (``mod``, ``mod:func``, a file path
            made absolute).
        extension_paths: Folders the agents add to ``sys.path`` before importing them.
        planning_timeout_s: Each deployed role's ``Settings.planning_timeout_s`` as ``up``
            deployed it (0 for an agent that plans with its rules); ``None`` when the record
            does not say (one written before it was kept).
    """

    extensions: tuple[str, ...] = ()
    extension_paths: tuple[Path, ...] = field(default_factory=tuple)
    planning_timeout_s: Mapping[str, float] | None = None


def absolute_extensions(extensions: Sequence[str], cwd: Path) -> tuple[str, ...]:
    """``extensions`` with a file path (``x.py``, ``x.py:func``) made absolute from ``cwd``."""
    made: list[str] = []
    for name in extensions:
        target, colon, attr = name.strip().partition(":")
        if target.endswith(".py"):
            target = str((cwd / Path(target).expanduser()).resolve())
        made.append(target + colon + attr)
    return tuple(made)


def write_record(state_dir: Path, record: DeploymentRecord) -> None:
    """Replace the record (atomically; mode 0600)."""
    path = state_dir / RECORD_FILE
    scratch = path.with_name(f".{RECORD_FILE}.{os.getpid()}")
    data: dict[str, object] = {
        "extensions": list(record.extensions),
        "extension_paths": [str(p) for p in record.extension_paths],
    }
    if record.planning_timeout_s is not None:
        data["planning_timeout_s"] = dict(record.planning_timeout_s)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.replace(scratch, path)


def remove_record(state_dir: Path) -> bool:
    """Remove the record; whether there was one."""
    try:
        (state_dir / RECORD_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def read_record(state_dir: Path) -> DeploymentRecord | None:
    """The record in ``state_dir``; ``None`` when there is none, or none to trust (logged)."""
    path = state_dir / RECORD_FILE
    try:
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        logger.error(
            "ignoring %s: extensions are code, and it is not a file only this user can write",
            path,
        )
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        extensions = tuple(str(name) for name in raw.get("extensions", []))
        paths = tuple(Path(str(p)) for p in raw.get("extension_paths", []))
    except (OSError, ValueError, TypeError, AttributeError):
        logger.warning("ignoring %s: not a deployment record", path)
        return None
    return DeploymentRecord(
        extensions=extensions,
        extension_paths=paths,
        planning_timeout_s=_planning(raw.get("planning_timeout_s"), path),
    )


def _planning(raw: object, path: Path) -> dict[str, float] | None:
    """The record's ``planning_timeout_s``: role -> seconds (0 to a day each), else ``None``
    (absent, or not that shape: logged; the deadline then follows the settings)."""
    if raw is None:
        return None
    if isinstance(raw, dict) and all(
        isinstance(role, str)
        and isinstance(seconds, int | float)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and 0 <= seconds <= 86400
        for role, seconds in raw.items()
    ):
        return {role: float(seconds) for role, seconds in raw.items()}
    logger.warning("ignoring %s's planning_timeout_s: not role -> seconds (0 to 86400)", path)
    return None
