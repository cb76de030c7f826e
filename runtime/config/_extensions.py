"""Which agents a deployment has: the four built-in ones, then those its extensions define.

Every process that must know the agents (the agents themselves, ``stratagem up``, the CLI's checks
of an agent's name, the operator API) imports the same extensions the agents load: those named in
``STRATAGEM_EXTENSIONS``, then the ``stratagem.extensions`` entry points. An extension that defines
an agent (``agents.define_agent``) registers its role as it is imported. A process with neither
imports nothing here (a request to a built-in agent loads no agent code).

An extension's code runs here, in the command's own process, before anything starts: one that
raises (``SystemExit`` included) is one line naming it, and so is one whose import does not finish
within ``STRATAGEM_EXTENSION_IMPORT_TIMEOUT_S`` (the import runs on a thread of its own, left
behind when the command stops).
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

from stratagem.protocol import roles
from stratagem.runtime.config._errors import InputError

__all__ = [
    "ENTRY_POINT_GROUP",
    "IMPORT_TIMEOUT_S",
    "deployment_roles",
    "import_agent_extensions",
    "settings_roles",
]

ENTRY_POINT_GROUP: Final = "stratagem.extensions"
"""``agents.ENTRY_POINT_GROUP``, named here so that a process without extensions does not import
the agents to learn it (a test keeps the two equal)."""
IMPORT_TIMEOUT_S: Final = 30.0
"""How long the extensions' imports may take (``Settings.extension_import_timeout_s``)."""


class ExtensionSettings(Protocol):
    """What ``settings_roles`` reads of ``Settings`` (a protocol, so that this module does not
    import ``_settings``, which imports it)."""

    @property
    def extensions(self) -> Sequence[str]: ...
    @property
    def extension_paths(self) -> Sequence[Path]: ...
    @property
    def extension_import_timeout_s(self) -> float: ...


def import_agent_extensions(
    extensions: Sequence[str], paths: Sequence[Path] = (), *, timeout_s: float = IMPORT_TIMEOUT_S
) -> None:
    """Import ``extensions`` and the entry points, as every agent does (a module imported before
    is not imported again), with ``paths`` on ``sys.path`` first as the agents have them (the
    folder ``stratagem up`` ran in, for a command run from another one), within ``timeout_s``.

    Raises:
        InputError: An extension cannot be imported, defines an agent badly, raises (even
            ``SystemExit``), or does not finish importing within ``timeout_s`` (one line naming
            the extension and the problem).
    """
    names = tuple(name.strip() for name in extensions if name.strip())
    for folder in map(str, paths):
        if names and folder not in sys.path:
            sys.path.append(folder)
    if not names and not importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        return
    from stratagem.agents import ExtensionError, import_extensions

    current = ["", ""]  # the extension importing now; "" once done
    failure: list[BaseException] = []

    def run() -> None:
        try:
            for name in names:
                current[0] = name
                import_extensions((name,))
            current[0] = "the stratagem.extensions entry points"
            import_extensions((), entry_points=True)
            current[0] = ""
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=run, name="stratagem-extension-import", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise InputError(
            f"extension {current[0]}: its import did not finish within {timeout_s:g} s "
            "(STRATAGEM_EXTENSION_IMPORT_TIMEOUT_S); nothing was started"
        )
    if failure:
        exc = failure[0]
        if isinstance(exc, ExtensionError):
            raise InputError(str(exc)) from exc
        raise InputError(
            f"extension {current[0]}: importing it failed: {type(exc).__name__}: {exc}"
        ) from exc


def deployment_roles(
    extensions: Sequence[str], paths: Sequence[Path] = (), *, timeout_s: float = IMPORT_TIMEOUT_S
) -> tuple[str, ...]:
    """Every agent's role: the built-in four, then those ``extensions`` (imported with ``paths``
    on ``sys.path``) and the entry points define.

    Raises:
        InputError: An extension cannot be imported, defines an agent badly, or does not finish
            importing within ``timeout_s``.
    """
    import_agent_extensions(extensions, paths, timeout_s=timeout_s)
    return roles()


def settings_roles(settings: ExtensionSettings) -> tuple[str, ...]:
    """``deployment_roles`` of ``settings``' extensions, their folders and import timeout."""
    return deployment_roles(
        settings.extensions,
        settings.extension_paths,
        timeout_s=settings.extension_import_timeout_s,
    )
