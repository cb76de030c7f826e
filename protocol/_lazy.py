"""Names a package exports but imports on first use (PEP 562): what is optional (PostgreSQL needs
the ``postgres`` extra) or costly at start (Ray, gRPC, X.509) stays out of ``import`` until used.

Each package keeps its lazy names under ``TYPE_CHECKING`` too, so type checkers see them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``.

    Args:
        package: The package's ``__name__``.
        homes: Each lazy name and the module defining it, relative to ``package``
            (``"._store._postgres"``).

    Returns:
        The function to bind as the package's ``__getattr__``: the first access to a name imports
        its module and keeps the value in the package; any other name is an ``AttributeError``.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
