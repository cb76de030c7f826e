"""The protocol package's structure: no import cycle below its ``__init__``, a base below the
rest of it, and its sizes.

Read from the source with ``ast`` (the engine's check, ``tests/unit/planning/
test_engine_structure.py``, applied to protocol/): imports under ``TYPE_CHECKING`` and inside
functions count, so a cycle cannot hide behind a lazy import. The generated code
(``protocol/_gen``) is not ours to shape and is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.planning.test_engine_structure import _cycle, _imports

PROTOCOL = Path(__file__).resolve().parents[3] / "protocol"
PACKAGE = "stratagem.protocol"
# What every layer stands on (the storage base, the lazy exports, the error roots): private
# modules of the lowest layer that import nothing of protocol but each other.
BASE = (f"{PACKAGE}._storage", f"{PACKAGE}._lazy", f"{PACKAGE}._errors")
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


def _sources() -> list[Path]:
    return [path for path in sorted(PROTOCOL.rglob("*.py")) if "_gen" not in path.parts]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PROTOCOL).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _graph(replaced: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the protocol modules it imports, the package's ``__init__`` left out (it
    re-exports everything; ``replaced``: module -> another source)."""
    modules = {_module_name(path): path for path in _sources()}
    modules.update(replaced or {})
    known = set(modules)
    graph = {name: _imports(path, name, known) for name, path in modules.items()}
    graph.pop(PACKAGE)
    for deps in graph.values():
        deps.discard(PACKAGE)
    return graph


def test_the_protocol_package_has_no_import_cycle_below_its_init() -> None:
    graph = _graph()
    assert {f"{PACKAGE}._capabilities", f"{PACKAGE}._policy", f"{PACKAGE}._service"} <= set(graph)
    found = _cycle(graph)
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


def test_a_lazy_import_of_the_policy_in_the_capabilities_is_a_cycle(tmp_path: Path) -> None:
    # The check itself, on the cycle it guards against: the capabilities as they are, plus the
    # import inside a function that closed ``_capabilities -> _policy -> _service``.
    capabilities = tmp_path / "_capabilities.py"
    capabilities.write_text(
        (PROTOCOL / "_capabilities.py").read_text()
        + "\n\ndef _planted() -> None:\n"
        + "    from stratagem.protocol._policy import Policy  # noqa: F401\n"
    )
    found = _cycle(_graph({f"{PACKAGE}._capabilities": capabilities}))
    assert found is not None
    assert {f"{PACKAGE}._capabilities", f"{PACKAGE}._policy"} <= set(found)


def _in_base(module: str) -> bool:
    return any(module == base or module.startswith(f"{base}.") for base in BASE)


def _above_base(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each base module that imports a protocol module outside the base, with those modules."""
    return {
        module: sorted(dep for dep in deps if not _in_base(dep))
        for module, deps in graph.items()
        if _in_base(module) and any(not _in_base(dep) for dep in deps)
    }


def test_the_base_imports_nothing_of_protocol_above_it() -> None:
    graph = _graph()
    assert {module for module in graph if _in_base(module)} >= set(BASE)
    assert _above_base(graph) == {}


def test_the_base_check_sees_a_base_module_reaching_up(tmp_path: Path) -> None:
    lazy = tmp_path / "_lazy.py"
    lazy.write_text(
        (PROTOCOL / "_lazy.py").read_text()
        + "\n\ndef _planted() -> None:\n"
        + "    from stratagem.protocol._capabilities import ROLES  # noqa: F401\n"
    )
    assert _above_base(_graph({f"{PACKAGE}._lazy": lazy})) == {
        f"{PACKAGE}._lazy": [f"{PACKAGE}._capabilities"]
    }


def _too_long(path: Path, shown: str) -> list[str]:
    """The module itself and each function in it that is over its size limit."""
    source = path.read_text()
    found = []
    if (lines := source.count("\n")) > MAX_MODULE_LINES:
        found.append(f"{shown}: {lines} lines")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{shown}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_protocol_module_or_function_is_over_its_size() -> None:
    too_long = [
        found for path in _sources() for found in _too_long(path, str(path.relative_to(PROTOCOL)))
    ]
    assert too_long == []


def test_the_size_check_sees_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    padding = "\n" * MAX_MODULE_LINES
    source = tmp_path / "long.py"
    source.write_text(f"def long() -> None:\n{body}{padding}")
    assert _too_long(source, "long.py") == [
        f"long.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines",
        f"long.py:1 long: {MAX_FUNCTION_LINES + 1} lines",
    ]
