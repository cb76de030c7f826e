"""What extensions change in a process, put back after a test: capabilities, roles, defined
agents, imported extension modules and ``sys.path``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from stratagem.agents import _definition
from stratagem.protocol import CAPABILITIES, _capabilities

# Modules a test may import as extensions (dropped afterwards, so the next import runs them again).
EXTENSION_MODULES = (
    "examples",
    "stratagem_extension_",
    "tests.unit.agents.ext_",
    "tests.integration.a2a_tck_",  # the A2A TCK's scenario agent and the SUT that serves it
)


@contextmanager
def registries_kept() -> Iterator[None]:
    """Within the block, extensions may register anything; after it, the registries are as they
    were."""
    capabilities = dict(CAPABILITIES)
    roles = list(_capabilities._EXTENSION_ROLES)
    defined = dict(_definition._DEFINED)
    types = dict(_definition._TYPES)
    modules = set(sys.modules)
    path = list(sys.path)
    try:
        yield
    finally:
        CAPABILITIES.clear()
        CAPABILITIES.update(capabilities)
        _capabilities._EXTENSION_ROLES[:] = roles
        _definition._DEFINED.clear()
        _definition._DEFINED.update(defined)
        _definition._TYPES.clear()
        _definition._TYPES.update(types)
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if name.startswith(EXTENSION_MODULES):
                module = sys.modules.pop(name)
                # A package kept from before holds its new submodule as an attribute too, which
                # `from package import submodule` would find without importing it again.
                parent, _, child = name.rpartition(".")
                if getattr(sys.modules.get(parent), child, None) is module:
                    delattr(sys.modules[parent], child)
