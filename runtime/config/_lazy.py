"""The runtime's one way to import lazily: a ``"module"`` or ``"module:attr"`` reference,
imported on first use (Prefect's CLI registers its commands the same way).

A name whose module is costly to import (Ray, gRPC, the agents) or that sits where the importer may
not import statically (the operator reaching the host's Ray directory: see the import contracts in
pyproject.toml) is named by such a string in a table of its user (``runtime.__init__``'s exports,
the CLI's command modules and tiers, ``operator._operator.RAY_DIRECTORY``) and loaded through
``load``; nothing else in the runtime calls ``importlib.import_module`` (a unit test checks it).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load"]


def load(reference: str) -> Any:
    """The module ``reference`` names (``"package.module"``), or its attribute
    (``"package.module:attr"``), the module imported now.

    Raises:
        ValueError: ``reference`` is neither.
    """
    module_name, colon, attr = reference.partition(":")
    if not module_name or (colon and not attr):
        raise ValueError(f"lazy reference {reference!r} is not 'module' or 'module:attr'")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if colon else module
