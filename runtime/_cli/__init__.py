"""The ``stratagem`` command line.

Every command turns bad input and runtime failures into one line on standard error and a non-zero
exit code (2: the input was wrong; 1: the runtime refused or failed); no stack trace reaches the
user. ``--json`` prints machine-readable output on standard output.

One module per group of commands, each registering its commands on the apps of ``_app`` when it is
imported: ``COMMAND_MODULES`` is in the order ``stratagem --help`` lists them.
"""

from __future__ import annotations

import importlib

from stratagem.runtime._cli._app import app, main

__all__ = ["app", "main"]

COMMAND_MODULES = ("_goals", "_agents", "_plans", "_deploy", "_ops", "_console")

for _module in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
