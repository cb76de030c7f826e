"""The CLI starts without loading what only its commands need (issue: a CLI that starts fast).

Asserted on modules, never on time: which heavy packages a ``--help`` or ``--version`` process
has imported when it exits.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from stratagem.protocol import OPERATOR
from stratagem.runtime import _cli
from stratagem.runtime._cli import _app

CLI_PACKAGE = Path(str(_cli.__file__)).parent
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


@pytest.mark.parametrize(
    "args", [("--help",), ("-h",), ("--version",), ("plans", "-h"), ("plans", "approve", "-h")]
)
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


def _typed_imports(path: Path) -> dict[str, tuple[str, ...]]:
    """The names a module imports under ``if TYPE_CHECKING:``, by the module they come from."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typed: dict[str, tuple[str, ...]] = {}
    for block in tree.body:
        if not (
            isinstance(block, ast.If)
            and isinstance(block.test, ast.Name)
            and block.test.id == "TYPE_CHECKING"
        ):
            continue
        for node in block.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                typed[node.module] = tuple(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    typed[alias.name] = ()
    return typed


def test_the_lazy_import_tables_match_the_type_checking_imports() -> None:
    modules = [
        _app,
        *(importlib.import_module(f"{_cli.__name__}.{name}") for name in _cli.COMMAND_MODULES),
    ]
    # Every module of the package is the base or a command module: none escapes the check.
    assert {path.stem for path in CLI_PACKAGE.glob("*.py")} - {"__init__"} == {
        module.__name__.rpartition(".")[2] for module in modules
    }
    tiers = {source: names for tier in _app.TIERS for source, names in tier.items()}
    used: dict[str, set[str]] = {}
    typed_by_module = {}
    for module in modules:
        typed = _typed_imports(Path(str(module.__file__)))
        typed_by_module[module] = typed
        for source, names in typed.items():
            assert source in tiers, f"{module.__name__} imports {source} outside the tiers"
            assert set(names) <= set(tiers[source]), (module.__name__, source, names)
            used.setdefault(source, set()).update(names)
    # ...and every name of the tiers is used by some module.
    assert used == {source: set(names) for source, names in tiers.items()}
    _app._load_runtime()
    _app._load_agents()
    bound = {**_app._RUNTIME_IMPORTS, **_app._AGENT_IMPORTS}
    for module, typed in typed_by_module.items():
        for source, names in typed.items():
            for name in names if source in bound else ():
                assert name in vars(module), (module.__name__, name)


def test_no_command_imports_inside_a_function() -> None:
    # One lazy-import mechanism: the tiers (bound by _app._bind through config._lazy.load). A
    # command module imports at its top, under TYPE_CHECKING for a tier's names, and nowhere else.
    inline = []
    for path in sorted(CLI_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inline.extend(
                    f"{path.name}:{inner.lineno}"
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.Import | ast.ImportFrom)
                )
    assert not inline, f"import through a tier of _cli/_app.py instead: {inline}"


def test_the_cli_default_caller_is_the_operator() -> None:
    assert _app._OPERATOR == OPERATOR


def test_what_commands_load_first_leaves_ray_out() -> None:
    # request, describe, plans and audit reach agents over gRPC first; only Deployment joins Ray.
    code = (
        "import sys\nfrom stratagem.runtime._cli import _app\n_app._load_runtime()\n"
        "print('ray' in sys.modules, 'grpc' in sys.modules, 'stratagem.planning' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "True", "False"]
