"""User extensions: modules that add tools and capabilities to an agent without editing Stratagem.

An extension is named in one of three ways:

- ``package.module``: the module's ``setup(agent)`` is called;
- ``package.module:function``: ``function(agent)`` is called (or ``function.setup(agent)`` when the
  attribute is an object with a ``setup`` method);
- ``path/to/file.py`` (optionally ``:function``): the file is imported as a module first.

Module names are imported from ``sys.path``; when that fails because the top-level package is not
found, the current directory is tried as well, so ``examples.extensions.word_count`` works from a
checkout. Entry points in the group ``stratagem.extensions`` are loaded too (each names a module or
a function, as above).

Every agent loads every extension; an extension that serves one role checks ``agent.role``.

An extension may also define a whole agent of its own (``agents.define_agent`` when its module is
imported: see ``_definition``); such a module needs no ``setup``. A definition the module makes is
refused on import, as an ``ExtensionError`` naming the extension and the problem in one line.
Extensions are imported before any agent is built, so the agents they define are known then.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from stratagem.agents._errors import AgentDefinitionError, ExtensionError

if TYPE_CHECKING:
    from stratagem.agents._agent import Agent

__all__ = [
    "ENTRY_POINT_GROUP",
    "Extension",
    "Setup",
    "extension_setups",
    "import_extensions",
    "load_extensions",
    "set_up",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = "stratagem.extensions"
"""The entry-point group scanned for extensions."""

Setup = Callable[["Agent"], None]
"""What an extension does to each agent."""

# What an extension's import or setup may raise that is its failure, not the process's: a
# ``SystemExit`` from an extension's code would otherwise end the command silently (exit 0).
_IMPORT_FAILURES: Final = (Exception, SystemExit)


@runtime_checkable
class Extension(Protocol):
    """Something that sets up an agent: a module with a ``setup`` function, or an object."""

    def setup(self, agent: Agent) -> None:
        """Add tools, capabilities or anything else to ``agent``."""
        ...


def _failed(name: str, what: str, exc: BaseException) -> ExtensionError:
    """The one-line error of an import that raised ``exc`` (a refused agent definition: its
    reason alone)."""
    if isinstance(exc, AgentDefinitionError):
        return ExtensionError(name, str(exc))
    return ExtensionError(name, f"{what} failed: {type(exc).__name__}: {exc}")


def _import_file(name: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise ExtensionError(name, f"no such file: {path}")
    module_name = f"stratagem_extension_{path.stem}"
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path.resolve()):
        # Imported once per process, as a module name is: what it registers is registered once.
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, path.resolve())
    if spec is None or spec.loader is None:
        raise ExtensionError(name, f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except _IMPORT_FAILURES as exc:
        del sys.modules[module_name]
        raise _failed(name, f"importing {path}", exc) from exc
    return module


def _import_module(name: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        cwd = os.getcwd()
        if exc.name != top or cwd in sys.path:
            raise ExtensionError(name, f"cannot import module {module_name!r}: {exc}") from exc
        sys.path.append(cwd)
        try:
            return importlib.import_module(module_name)
        except _IMPORT_FAILURES as retry:
            sys.path.remove(cwd)
            raise _failed(name, f"importing module {module_name!r}", retry) from retry
    except _IMPORT_FAILURES as exc:
        raise _failed(name, f"importing module {module_name!r}", exc) from exc


def _resolve(name: str) -> Setup:
    target, _, attr = name.partition(":")
    if not target:
        raise ExtensionError(name, "expected 'module', 'module:function' or 'file.py'")
    if target.endswith(".py"):
        module = _import_file(name, Path(target))
    else:
        module = _import_module(name, target)
    return _setup_of(name, module, attr)


def _setup_of(name: str, obj: object, attr: str) -> Setup:
    if attr:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ExtensionError(name, f"the module has no attribute {attr!r}") from None
        if isinstance(obj, Extension) and not isinstance(obj, ModuleType):
            return obj.setup
        if callable(obj):
            return obj
        raise ExtensionError(name, f"{attr!r} is neither callable nor has a setup method")
    setup = getattr(obj, "setup", None)
    if callable(setup):
        return setup  # type: ignore[no-any-return]
    if isinstance(obj, ModuleType) and _defines_an_agent(obj):
        return _nothing_to_set_up
    raise ExtensionError(name, "the module has no setup(agent) function and defines no agent")


def _defines_an_agent(module: ModuleType) -> bool:
    from stratagem.agents._definition import AgentSpec  # it imports the role agents

    return any(isinstance(value, AgentSpec) for value in vars(module).values())


def _nothing_to_set_up(agent: Agent) -> None:
    """The setup of a module that only defines an agent: its import did everything."""


def _entry_points() -> list[tuple[str, Setup]]:
    found: list[tuple[str, Setup]] = []
    for point in sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name
    ):
        label = f"entry point {point.name} ({point.value})"
        try:
            loaded = point.load()
        except _IMPORT_FAILURES as exc:
            raise _failed(label, "loading", exc) from exc
        if isinstance(loaded, ModuleType) or (
            isinstance(loaded, Extension) and not callable(loaded)
        ):
            found.append((label, _setup_of(label, loaded, "")))
        elif callable(loaded):
            found.append((label, loaded))
        else:
            raise ExtensionError(label, "neither a module, a function nor an extension object")
    return found


def extension_setups(names: Sequence[str], *, entry_points: bool) -> list[tuple[str, Setup]]:
    """Import each named extension (then, with ``entry_points``, every entry point): the agents
    and capabilities they define are registered; their setups are returned, in order.

    Raises:
        ExtensionError: An extension cannot be imported, defines an agent badly, or has no setup
            function (and defines no agent).
    """
    setups = [(name.strip(), _resolve(name.strip())) for name in names if name.strip()]
    if entry_points:
        setups.extend(_entry_points())
    return setups


def import_extensions(names: Sequence[str], *, entry_points: bool = False) -> None:
    """Import each named extension (and, with ``entry_points``, every entry point) without
    setting up an agent.

    A process that only sends requests (the CLI) calls this so that the capabilities and agents an
    extension registers on import can be validated and encoded there too.

    Raises:
        ExtensionError: An extension cannot be imported, defines an agent badly, or has no setup
            function (and defines no agent).
    """
    extension_setups(names, entry_points=entry_points)


def set_up(agent: Agent, setups: Sequence[tuple[str, Setup]]) -> list[str]:
    """Run each extension's setup on ``agent``; the names of those run, in order.

    Raises:
        ExtensionError: A setup failed; the message names the extension.
    """
    loaded = []
    for name, setup in setups:
        try:
            setup(agent)
        except ExtensionError:
            raise
        except _IMPORT_FAILURES as exc:
            raise ExtensionError(
                name, f"setup failed on the {agent.role} agent: {type(exc).__name__}: {exc}"
            ) from exc
        logger.info("agent %s loaded extension %s", agent.role, name)
        loaded.append(name)
    return loaded


def load_extensions(names: Sequence[str], agent: Agent, *, entry_points: bool = True) -> list[str]:
    """Import each named extension (and, by default, every entry point) and set up ``agent``.

    Args:
        names: Extensions as ``module``, ``module:function`` or ``file.py[:function]``.
        agent: The agent to set up.
        entry_points: Also load the ``stratagem.extensions`` entry points.

    Returns:
        The extensions loaded, in the order they were set up (names first, then entry points).

    Raises:
        ExtensionError: An extension cannot be imported, has no setup function, or its setup
            failed; the message names the extension.
    """
    return set_up(agent, extension_setups(names, entry_points=entry_points))
