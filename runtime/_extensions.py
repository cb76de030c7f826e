"""Which agents a deployment has: the four built-in ones, then those its extensions define.

Every process that must know the agents (the agents themselves, ``stratagem up``, the CLI's checks
of an agent's name, the operator API) imports the same extensions the agents load: those named in
``STRATAGEM_EXTENSIONS``, then the ``stratagem.extensions`` entry points. An extension that defines
an agent (``agents.define_agent``) registers its role as it is imported. A process with neither
imports nothing here (a request to a built-in agent loads no agent code).
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from stratagem.protocol import roles
from stratagem.runtime._input import InputError

__all__ = ["ENTRY_POINT_GROUP", "deployment_roles", "import_agent_extensions"]

ENTRY_POINT_GROUP: Final = "stratagem.extensions"
"""``agents.ENTRY_POINT_GROUP``, named here so that a process without extensions does not import
the agents to learn it (a test keeps the two equal)."""


def import_agent_extensions(extensions: Sequence[str], paths: Sequence[Path] = ()) -> None:
    """Import ``extensions`` and the entry points, as every agent does (a module imported before
    is not imported again), with ``paths`` on ``sys.path`` first as the agents have them (the
    folder ``stratagem up`` ran in, for a command run from another one).

    Raises:
        InputError: An extension cannot be imported or defines an agent badly (one line naming
            the extension and the problem).
    """
    names = tuple(name.strip() for name in extensions if name.strip())
    for folder in map(str, paths):
        if names and folder not in sys.path:
            sys.path.append(folder)
    if names or importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        from stratagem.agents import ExtensionError, import_extensions

        try:
            import_extensions(names, entry_points=True)
        except ExtensionError as exc:
            raise InputError(str(exc)) from exc


def deployment_roles(extensions: Sequence[str], paths: Sequence[Path] = ()) -> tuple[str, ...]:
    """Every agent's role: the built-in four, then those ``extensions`` (imported with ``paths``
    on ``sys.path``) and the entry points define.

    Raises:
        InputError: An extension cannot be imported or defines an agent badly.
    """
    import_agent_extensions(extensions, paths)
    return roles()
