"""The CLI starts without loading what only its commands need (issue: a CLI that starts fast).

Asserted on modules, never on time: which heavy packages a ``--help`` or ``--version`` process
has imported when it exits.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from stratagem.protocol import OPERATOR
from stratagem.runtime import _cli

CLI_SOURCE = Path(_cli.__file__)
# pydantic is not among them: typer itself may import it to convert a subcommand's parameters.
HEAVY = ("ray", "grpc", "pydantic_settings", "opentelemetry.sdk", "yaml")

# Runs the console script's entry point, then reports which heavy modules got imported.
PROBE = """
import sys
from stratagem.runtime._cli import main
sys.argv = ["stratagem", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = [name for name in {heavy!r} if name in sys.modules]
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def _heavy_after(*args: str) -> tuple[list[str], str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = next(x for x in result.stderr.splitlines() if x.startswith("HEAVY="))
    loaded = [name for name in line.removeprefix("HEAVY=").split(",") if name]
    return loaded, result.stdout


@pytest.mark.parametrize("args", [("--help",), ("-h",), ("--version",), ("plans", "-h")])
def test_help_and_version_load_no_runtime(args: tuple[str, ...]) -> None:
    loaded, out = _heavy_after(*args)
    assert loaded == [], f"stratagem {' '.join(args)} imported {loaded}"
    assert out.strip()


def test_version_names_the_installed_distribution() -> None:
    _, out = _heavy_after("--version")
    assert out.strip().startswith("stratagem ")
    assert out.strip() != "stratagem unknown"


def test_help_offers_shell_completion() -> None:
    _, out = _heavy_after("--help")
    assert "--install-completion" in out
    assert "--show-completion" in out


def test_a_command_loads_what_it_needs() -> None:
    # `audit verify` on an empty state directory runs a real command body.
    loaded, _ = _heavy_after("audit", "verify", "--state-dir", "/nonexistent/stratagem-state")
    assert "pydantic_settings" in loaded


def test_the_lazy_import_table_matches_the_type_checking_imports() -> None:
    tree = ast.parse(CLI_SOURCE.read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    typed: dict[str, tuple[str, ...]] = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            typed[node.module] = tuple(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                typed[alias.name] = ()
    assert typed == {**_cli._RUNTIME_IMPORTS, **_cli._AGENT_IMPORTS, **_cli._RAY_IMPORTS}
    _cli._load_runtime()
    _cli._load_agents()
    for names in [*_cli._RUNTIME_IMPORTS.values(), *_cli._AGENT_IMPORTS.values()]:
        for name in names:
            assert name in vars(_cli), name


def test_the_cli_default_caller_is_the_operator() -> None:
    assert _cli._OPERATOR == OPERATOR


def test_what_commands_load_first_leaves_ray_out() -> None:
    # request, describe, plans and audit reach agents over gRPC first; only Deployment joins Ray.
    code = (
        "import sys\nfrom stratagem.runtime import _cli\n_cli._load_runtime()\n"
        "print('ray' in sys.modules, 'grpc' in sys.modules, 'stratagem.planning' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "True", "False"]
