"""The ``stratagem`` command line.

Every command turns bad input and runtime failures into one line on standard error and a non-zero
exit code (2: the input was wrong; 1: the runtime refused or failed); no stack trace reaches the
user. ``--json`` prints machine-readable output on standard output.

One module per group of commands, each registering its commands on the apps of ``_app`` when it is
imported: ``COMMAND_MODULES`` is in the order ``stratagem --help`` lists them.
"""

from __future__ import annotations

import inspect

import typer

from stratagem.runtime._cli._app import app, main
from stratagem.runtime.config._lazy import load

__all__ = ["app", "main"]

COMMAND_MODULES = (
    "_goals",
    "_ask",
    "_agents",
    "_plans",
    "_research",
    "_worlds",
    "_memory",
    "_artifacts",
    "_deploy",
    "_ops",
    "_console",
)

for _module in COMMAND_MODULES:
    load(f"{__name__}.{_module}")


def _one_line_summaries(group: typer.Typer) -> None:
    """Give every command the first paragraph of its help as one line for the lists of commands
    (typer keeps a docstring's line breaks there, which break the list's columns)."""
    for info in group.registered_commands:
        if info.short_help is None:
            doc = info.help or (info.callback.__doc__ if info.callback else None) or ""
            info.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


_one_line_summaries(app)
