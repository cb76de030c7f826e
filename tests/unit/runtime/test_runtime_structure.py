"""The runtime's structure: one package per program, each importing only what is below it.

Read from the source with ``ast`` (imports under ``TYPE_CHECKING`` and inside functions included,
as in ``tests/unit/agents/test_agent_structure.py``), beside the import contracts that
``lint-imports`` checks (``tests/unit/test_architecture.py``): ``runtime/`` holds its packages and
no flat module; ``config/`` (the base) imports nothing else of the runtime; the operator's side
(``operator/``, the console, ``config/``, ``telemetry/``) never imports Ray nor ``host/``; no
import cycle among the runtime's modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.planning.test_engine_structure import _cycle, _imports

REPO = Path(__file__).resolve().parents[3]
RUNTIME = REPO / "runtime"
PACKAGE = "stratagem.runtime"
PACKAGES = frozenset({"config", "host", "operator", "telemetry", "_cli", "_console"})
# What each package may import of the runtime (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "config": frozenset(),
    "telemetry": frozenset({"config"}),
    "host": frozenset({"config", "telemetry"}),
    "operator": frozenset({"config", "telemetry"}),
    "_console": frozenset({"config", "telemetry", "operator"}),
    "_cli": frozenset({"config", "telemetry", "operator", "host", "_console"}),
}
OPERATOR_SIDE = ("config", "telemetry", "operator", "_console")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(RUNTIME.rglob("*.py"))}


def _graph() -> dict[str, set[str]]:
    """Module -> the runtime modules it imports, package ``__init__`` files left out (they
    re-export, lazily, what is below them)."""
    modules = _modules()
    known = set(modules)
    inits = {name for name, path in modules.items() if path.name == "__init__.py"}
    return {
        name: _imports(path, name, known) - inits
        for name, path in modules.items()
        if name not in inits
    }


def _package_of(module: str) -> str:
    return module.removeprefix(f"{PACKAGE}.").split(".")[0]


def _external_roots(path: Path) -> set[str]:
    """The top-level names of what ``path`` imports absolutely (``ray`` for ``ray._raylet``)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_runtime_holds_its_packages_and_no_flat_module() -> None:
    flat = sorted(p.name for p in RUNTIME.glob("*.py") if p.name != "__init__.py")
    assert not flat, f"a module under runtime/ belongs in one of {sorted(PACKAGES)}: {flat}"
    packages = {p.parent.name for p in RUNTIME.glob("*/__init__.py")}
    assert packages == PACKAGES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_is_below_it(package: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if _package_of(module) == package
        for target in targets
        if _package_of(target) not in ALLOWED[package] | {package}
    )
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: {wrong}"


@pytest.mark.parametrize("package", OPERATOR_SIDE)
def test_the_operator_side_never_imports_ray(package: str) -> None:
    wrong = sorted(
        name
        for name, path in _modules().items()
        if _package_of(name) == package and "ray" in _external_roots(path)
    )
    assert not wrong, f"only host/ imports Ray: {wrong}"


def test_the_runtime_modules_have_no_import_cycle() -> None:
    graph = _graph()
    found = _cycle(graph)
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


def test_the_operator_and_the_console_load_without_ray_or_the_host() -> None:
    code = (
        "import sys\n"
        "import stratagem.runtime._console._routes, stratagem.runtime.operator._operator_sync\n"
        "import stratagem.runtime.operator._auditing, stratagem.runtime.config._stores\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')\n"
        "             or m.startswith('stratagem.runtime.host')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
# What may be over the limits, at most as long as it was: nothing now (a ratchet: it may shrink,
# not grow, and nothing may join it).
OVER_LIMIT: dict[str, int] = {}


def _sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        where = path.relative_to(RUNTIME).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        sizes[where] = len(path.read_text().splitlines())
        for node in tree.body:
            members = node.body if isinstance(node, ast.ClassDef) else [node]
            prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
            for member in members:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (member.end_lineno or member.lineno) - member.lineno + 1
                    sizes[f"{where}:{prefix}{member.name}"] = length
    return sizes


def test_no_runtime_module_or_function_grows_past_the_limits() -> None:
    wrong = []
    for name, size in _sizes().items():
        limit = MAX_FUNCTION_LINES if ":" in name else MAX_MODULE_LINES
        allowed = max(limit, OVER_LIMIT.get(name, 0))
        if size > allowed:
            wrong.append(f"{name}: {size} lines (at most {allowed})")
    assert not wrong, f"over the size limits: {wrong}"
