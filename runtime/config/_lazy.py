"""The runtime's one way to import lazily: a ``"module:attr"`` reference, imported on first use.

A name whose module is costly to import (Ray, gRPC, the agents) or that sits where the importer may
not import statically (the operator reaching the host's Ray directory: see the import contracts in
pyproject.toml) is named by such a string in a table of its user (``runtime.__init__``'s exports,
the CLI's tiers, ``operator._operator.RAY_DIRECTORY``) and loaded through ``load``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load"]


def load(reference: str) -> Any:
    """The object ``reference`` (``"package.module:attr"``) names, its module imported now.

    Raises:
        ValueError: ``reference`` is not ``"module:attr"``.
    """
    module_name, colon, attr = reference.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"lazy reference {reference!r} is not 'module:attr'")
    return getattr(importlib.import_module(module_name), attr)
