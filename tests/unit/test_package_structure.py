"""Every package's sizes and import cycles, measured the same way (STYLE rules 19 and 20, issue 33).

Read from the source with ``ast``, over every module of ``protocol/``, ``planning/``, ``agents/``
and ``runtime/`` (the generated ``protocol/_gen`` left out):

- no module over ``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES`` (methods
  and nested functions included), except what ``OVER_LIMIT`` names, each at most as long as it is
  today (a ratchet: it may shrink, not grow, and nothing new may join it);
- no import cycle among the modules of each package, imports under ``TYPE_CHECKING`` and inside
  functions included (so a cycle cannot hide behind a lazy import). A package's ``__init__``
  files are left out: they re-export what is below them, and nothing below imports them back.

The packages' own structure tests (``tests/unit/*/test_*_structure.py``) check what is particular
to each; this one holds them all to one measure. Each check is shown to fail on a planted
violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.planning.test_engine_structure import _cycle, _imports

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "planning", "agents", "runtime")
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
# What may be over the limits, at most this long: nothing now (a ratchet that only shrinks).
OVER_LIMIT: dict[str, int] = {}


def _sources(root: Path) -> list[Path]:
    return [path for path in sorted(root.rglob("*.py")) if "_gen" not in path.parts]


def sizes(root: Path, shown: str) -> dict[str, int]:
    """``shown/module`` -> its lines, and ``shown/module:qualified.name`` -> each function's
    lines (``Class.method``, ``outer.inner``), for every module under ``root``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found[f"{where}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, where, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, where, f"{prefix}{child.name}.")
            else:
                visit(child, where, prefix)

    for path in _sources(root):
        where = f"{shown}/{path.relative_to(root).as_posix()}"
        source = path.read_text()
        found[where] = len(source.splitlines())
        visit(ast.parse(source, str(path)), where, "")
    return found


def too_long(measured: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What is over its limit (and over what ``allowed`` lets it be)."""
    wrong = []
    for name, size in measured.items():
        limit = MAX_FUNCTION_LINES if ":" in name else MAX_MODULE_LINES
        if size > max(limit, allowed.get(name, 0)):
            wrong.append(f"{name}: {size} lines (at most {max(limit, allowed.get(name, 0))})")
    return wrong


def _module_name(root: Path, package: str, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, ``__init__`` files left out."""
    modules = {_module_name(root, package, path): path for path in _sources(root)}
    inits = {name for name, path in modules.items() if path.name == "__init__.py"}
    known = set(modules)
    return {
        name: _imports(path, name, known) - inits
        for name, path in modules.items()
        if name not in inits
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_or_function_of_the_package_is_over_its_size(package: str) -> None:
    measured = sizes(REPO / package, package)
    assert any(":" in name for name in measured)  # it saw the functions
    wrong = too_long(measured, OVER_LIMIT)
    assert not wrong, f"over the size limits (split it by what it does): {wrong}"


def test_what_is_allowed_over_the_limits_still_exists() -> None:
    measured: dict[str, int] = {}
    for package in PACKAGES:
        measured.update(sizes(REPO / package, package))
    assert set(OVER_LIMIT) <= set(measured)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_has_no_import_cycle(package: str) -> None:
    graph = import_graph(REPO / package, f"stratagem.{package}")
    assert len(graph) > 5
    found = _cycle(graph)
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


# --- the checks on planted violations --------------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_size_check_sees_a_long_module_a_long_method_and_a_long_nested_function(
    tmp_path: Path,
) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    root = _plant(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "_long.py": "\n" * (MAX_MODULE_LINES + 1),
            "_sub/_method.py": f"class A:\n    def run(self) -> None:\n{body}",
            "_nested.py": f"def outer() -> None:\n    def inner() -> None:\n{body}",
            "_short.py": f"def short() -> None:\n{body[: body.index(chr(10)) + 1]}",
        },
    )
    wrong = too_long(sizes(root, "pkg"), {})
    assert wrong == [
        f"pkg/_long.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
        f"pkg/_nested.py:outer: {MAX_FUNCTION_LINES + 2} lines (at most {MAX_FUNCTION_LINES})",
        f"pkg/_nested.py:outer.inner: {MAX_FUNCTION_LINES + 1} lines (at most "
        f"{MAX_FUNCTION_LINES})",
        f"pkg/_sub/_method.py:A.run: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})",
    ]
    # An allowance lets a function be as long as it was, not longer.
    allowed = {"pkg/_sub/_method.py:A.run": MAX_FUNCTION_LINES + 1}
    assert not [w for w in too_long(sizes(root, "pkg"), allowed) if "A.run" in w]
    allowed = {"pkg/_sub/_method.py:A.run": MAX_FUNCTION_LINES}
    assert [w for w in too_long(sizes(root, "pkg"), allowed) if "A.run" in w]


def test_the_cycle_check_sees_a_cycle_through_a_lazy_type_only_import(tmp_path: Path) -> None:
    root = _plant(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg._a import A\nfrom pkg._b import B\n",
            "_a.py": "from pkg._b import B\n\nclass A: ...\n",
            "_b.py": (
                "from typing import TYPE_CHECKING\n\n"
                "if TYPE_CHECKING:\n    from pkg import _a\n\n"
                "class B: ...\n"
            ),
        },
    )
    found = _cycle(import_graph(root, "pkg"))
    assert found is not None
    assert {"pkg._a", "pkg._b"} <= set(found)
    (root / "_b.py").write_text("class B: ...\n")
    assert _cycle(import_graph(root, "pkg")) is None
