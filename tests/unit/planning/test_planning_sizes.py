"""The sizes of planning/ (STYLE rule 19, issue 33 point 5): no module over 800 lines, no function
over 100, read from the source with ``ast``.

What is over today is named below with its size, and may only shrink: a module or function that
grows past its allowance fails, and so does one that came under the limit while still listed
(remove it from the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

PLANNING = Path(__file__).resolve().parents[3] / "planning"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100

# module -> its lines today (none left: the run's state is a package split by concern).
MODULES_OVER: dict[str, int] = {}
# "module:function" -> its lines today (none left).
FUNCTIONS_OVER: dict[str, int] = {}


def module_lines(source: str) -> int:
    return len(source.splitlines())


def long_functions(source: str, limit: int) -> dict[str, int]:
    """The functions (methods included) of ``source`` longer than ``limit`` lines."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found[node.name] = lines
    return found


def _sources() -> dict[str, str]:
    return {
        path.relative_to(PLANNING).as_posix(): path.read_text()
        for path in sorted(PLANNING.rglob("*.py"))
        if "_gen" not in path.parts
    }


def test_the_measures_see_a_long_module_and_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    source = f"def f():\n{body}\n\nasync def g():\n    pass\n"
    assert long_functions(source, 5) == {"f": 6}
    assert module_lines(source) == 9


def test_no_planning_module_is_over_800_lines() -> None:
    sizes = {name: module_lines(source) for name, source in _sources().items()}
    over = {
        name: n
        for name, n in sizes.items()
        if n > MAX_MODULE_LINES and n > MODULES_OVER.get(name, 0)
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
    stale = {name for name in MODULES_OVER if sizes.get(name, 0) <= MAX_MODULE_LINES}
    assert not stale, f"under the limit now, remove from MODULES_OVER: {stale}"


def test_no_planning_function_is_over_100_lines() -> None:
    found = {
        f"{name}:{function}": n
        for name, source in _sources().items()
        for function, n in long_functions(source, MAX_FUNCTION_LINES).items()
    }
    over = {key: n for key, n in found.items() if n > FUNCTIONS_OVER.get(key, 0)}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
    stale = set(FUNCTIONS_OVER) - set(found)
    assert not stale, f"under the limit now, remove from FUNCTIONS_OVER: {stale}"
