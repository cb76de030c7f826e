"""The engine's structure: a run is parts composed around one state that alone changes it.

Read from the source with ``ast``: no import cycle among the planning package's modules (imports
under ``TYPE_CHECKING`` and inside functions included), no class of the engine inheriting from
another of its classes, and no module of the engine outside the ``_state`` package writing the
run's state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLANNING = Path(__file__).resolve().parents[3] / "planning"
ENGINE = PLANNING / "_engine"
STATE = ENGINE / "_state"  # the run's state and its transitions, by concern: the one writer
PACKAGE = "stratagem.planning"

# The run's state: fields only ``_RunState`` may assign or mutate.
GUARDED = frozenset(
    {
        "statuses",
        "outputs",
        "failures",
        "stop_reason",
        "cancelled",
        "paused",
        "interrupted",
        "blocked",
        "ready",
        "next_attempt",
        "running",
        "waiting",
        "dependents",
        "compensable",
        "compensation_attempts",
        "expansions",
        "iterations",
    }
)
MUTATORS = frozenset(
    {
        "append",
        "appendleft",
        "extend",
        "insert",
        "pop",
        "popleft",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
    }
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PLANNING).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(root.rglob("*.py"))}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``path`` imports, anywhere in it (type-only ones too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            # ``import a.b.c`` also runs ``a`` and ``a.b``: the nearest known module counts.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    on_path, done = 1, 2
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = on_path
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        path.pop()
        state[node] = done
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def _graph(root: Path) -> dict[str, set[str]]:
    modules = _modules(root)
    known = set(_modules(PLANNING))
    graph = {name: _imports(path, name, known) for name, path in modules.items()}
    return {name: {dep for dep in deps if dep in graph} for name, deps in graph.items()}


def test_the_cycle_finder_finds_a_type_only_cycle(tmp_path: Path) -> None:
    # The check itself: a cycle through a TYPE_CHECKING import counts.
    (tmp_path / "a.py").write_text("from stratagem.planning.b import B\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from stratagem.planning.a import A\n"
    )
    names = {"stratagem.planning.a", "stratagem.planning.b"}
    graph = {
        "stratagem.planning.a": _imports(tmp_path / "a.py", "stratagem.planning.a", names),
        "stratagem.planning.b": _imports(tmp_path / "b.py", "stratagem.planning.b", names),
    }
    assert _cycle(graph) is not None


def test_the_engine_has_no_import_cycle() -> None:
    graph = _graph(ENGINE)
    assert len(graph) >= 15
    # The parts of dynamic steps are modules of the engine like the others.
    assert {f"{PACKAGE}._engine._map", f"{PACKAGE}._engine._nested"} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_planning_package_has_no_import_cycle_below_its_init() -> None:
    # The package's __init__ re-exports everything (and nothing imports it back); below it,
    # no module may need another that needs it.
    graph = _graph(PLANNING)
    graph.pop(PACKAGE)
    for deps in graph.values():
        deps.discard(PACKAGE)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def _engine_classes() -> dict[str, ast.ClassDef]:
    classes: dict[str, ast.ClassDef] = {}
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    return classes


def test_no_engine_class_inherits_from_another() -> None:
    classes = _engine_classes()
    inheriting = {
        name: base.id
        for name, node in classes.items()
        for generic in node.bases
        # ``_Base[P]`` names its class in the subscript's value
        for base in [generic.value if isinstance(generic, ast.Subscript) else generic]
        if isinstance(base, ast.Name) and base.id in classes
    }
    # Values and protocols may subclass (e.g. a config dataclass); the run's parts may not.
    assert inheriting == {}


def test_no_engine_class_leaves_a_hook_to_a_subclass() -> None:
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                called = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                assert not (isinstance(called, ast.Name) and called.id == "NotImplementedError"), (
                    f"{path.name}:{node.lineno} leaves a method to a subclass"
                )


def _field(node: ast.expr) -> str | None:
    """The guarded field ``node`` writes to (``x.statuses[k]``, ``x.stop_reason``), if any."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        if node.attr in GUARDED:
            return node.attr
        base = node.value
        if (isinstance(base, ast.Name) and base.id == "state") or (
            isinstance(base, ast.Attribute) and base.attr == "state"
        ):
            return f"state.{node.attr}"
    return None


def _writes(source: str) -> list[tuple[int, str]]:
    writes: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                field = _field(part)
                if field is not None:
                    writes.append((node.lineno, field))
    return writes


def test_the_writer_check_sees_writes() -> None:
    source = (
        "run.statuses['a'] = 1\n"
        "self.stop_reason = 'x'\n"
        "self.state.cancelled = True\n"
        "state.ready.append('a')\n"
        "del run.outputs['a']\n"
        "run.failures.extend([])\n"
    )
    assert [field for _, field in sorted(_writes(source))] == [
        "statuses",
        "stop_reason",
        "cancelled",
        "ready",
        "outputs",
        "failures",
    ]
    assert [field for _, field in _writes("self.state.blocked_by = 1\n")] == ["state.blocked_by"]
    assert _writes("x = run.statuses['a']\nrun.plan.steps.count(1)\n") == []


@pytest.mark.parametrize(
    "path",
    sorted(p for p in ENGINE.rglob("*.py") if STATE not in p.parents),
    ids=lambda p: p.relative_to(ENGINE).as_posix(),
)
def test_only_the_state_writes_the_runs_state(path: Path) -> None:
    assert _writes(path.read_text()) == [], f"{path.name} writes the run's state"


def test_the_state_package_is_the_one_writer() -> None:
    # The other side of the rule: the transitions are where the writes are.
    fields = {field for path in STATE.glob("*.py") for _, field in _writes(path.read_text())}
    assert {"statuses", "stop_reason", "cancelled", "outputs", "failures"} <= fields
    assert {"expansions", "iterations"} <= fields  # a map's items, a loop's iterations
