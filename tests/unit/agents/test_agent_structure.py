"""The agent's structure: ``Agent`` composes its parts, it does not inherit them.

Read from the source with ``ast`` (the engine's check, ``tests/unit/planning/
test_engine_structure.py``, applied to the agents package): no import cycle among the agents
modules (imports under ``TYPE_CHECKING`` and inside functions included), no part of the agent
inheriting from another, ``PlanControl`` built from its ``ControlDeps`` alone, and no module but
``_runs.py`` touching the runs in flight it owns. Over every module of the package: none over
``MAX_MODULE_LINES`` lines, no function over ``MAX_FUNCTION_LINES``, and no class subclassing
``Agent``, ``RoleAgent`` or ``ModelPlanner``, directly, through another class, under another name
or made with ``type(...)``: a role is data (an ``AgentRole``: its ``RoleSpec`` and the function
that builds one ``Agent`` of it), and a role's model answer a ``ModelAnswer`` value the one
``ModelPlanner`` composes. ``PLANTS`` holds the violations the check must see.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from stratagem.agents import (
    ROLE_TYPES,
    Agent,
    AgentRole,
    ModelPlanner,
    OrchestratorAgent,
    PerceptionAgent,
    RoleAgent,
    RoleSpec,
    StrategicAgent,
    TacticalAgent,
)
from stratagem.agents._control import ControlDeps, PlanControl
from stratagem.agents._model_answer import ModelAnswer
from stratagem.agents._model_roles import (
    ORCHESTRATOR_ANSWER,
    PERCEPTION_ANSWER,
    STRATEGIC_ANSWER,
    TACTICAL_ANSWER,
)
from tests.unit.planning.test_engine_structure import MUTATORS, _cycle, _imports

AGENTS = Path(__file__).resolve().parents[3] / "agents"
PACKAGE = "stratagem.agents"
# The modules ``Agent`` is made of.
PARTS = ("_agent", "_control", "_runs", "_planners", "_admission")
# What ``PlanRuns`` alone holds: the plans running for a caller, the background tasks, their
# started events, the unbound runs, the closing flag (and the names they had on ``Agent``).
RUNS_FIELDS = frozenset({"_serving", "_active", "_tasks", "_started", "_unbound", "_closing"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(AGENTS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _graph(replaced: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the agents modules it imports (``replaced``: module -> another source)."""
    modules = {_module_name(path): path for path in sorted(AGENTS.rglob("*.py"))}
    modules.update(replaced or {})
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _below_init(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # The package's __init__ re-exports everything (and nothing imports it back).
    graph.pop(PACKAGE)
    for deps in graph.values():
        deps.discard(PACKAGE)
    return graph


def test_the_agents_package_has_no_import_cycle_below_its_init() -> None:
    graph = _below_init(_graph())
    assert {f"{PACKAGE}.{part}" for part in PARTS} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_control_and_the_runs_know_nothing_of_the_agent() -> None:
    graph = _below_init(_graph())
    assert f"{PACKAGE}._agent" not in graph[f"{PACKAGE}._control"]
    assert graph[f"{PACKAGE}._runs"] == set()  # the bookkeeping needs no other part


def test_a_type_only_import_of_the_agent_in_the_control_is_a_cycle(tmp_path: Path) -> None:
    # The check itself, on the very regression it guards against: the control module as it is,
    # plus a type-only import of ``Agent`` (the mixin's old way to name its host).
    control = tmp_path / "_control.py"
    control.write_text(
        (AGENTS / "_control.py").read_text()
        + "\nfrom typing import TYPE_CHECKING\n"
        + "if TYPE_CHECKING:\n"
        + "    from stratagem.agents._agent import Agent\n"
    )
    graph = _below_init(_graph({f"{PACKAGE}._control": control}))
    found = _cycle(graph)
    assert found is not None
    assert {f"{PACKAGE}._agent", f"{PACKAGE}._control"} <= set(found)


def _classes() -> dict[str, tuple[str, ast.ClassDef]]:
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for part in PARTS:
        for node in ast.walk(ast.parse((AGENTS / f"{part}.py").read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (part, node)
    return classes


def test_no_part_of_the_agent_inherits_from_another() -> None:
    classes = _classes()
    assert {"Agent", "PlanControl", "ControlDeps", "PlanRuns", "Capabilities"} <= set(classes)
    inheriting = {
        name: base.id
        for name, (_, node) in classes.items()
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in classes
    }
    assert inheriting == {}
    assert Agent.__mro__ == (Agent, object)


def test_plan_control_is_built_from_its_dependencies_alone() -> None:
    parameters = list(inspect.signature(PlanControl.__init__).parameters)
    assert parameters == ["self", "deps"]
    assert dataclasses.is_dataclass(ControlDeps)
    assert ControlDeps.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert {field.name for field in dataclasses.fields(ControlDeps)} == {
        "role",
        "plan_type",
        "engine",
        "store",
        "book",
        "runs",
        "problems",
        "policy",
        "planner_of",
    }


def _touches(source: str) -> list[tuple[int, str, bool]]:
    """Each access to a field of ``RUNS_FIELDS``: (line, field, whether it writes it)."""
    tree = ast.parse(source)
    written: set[int] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            written.add(id(target))
    return [
        (node.lineno, node.attr, id(node) in written)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in RUNS_FIELDS
    ]


def test_the_access_check_sees_reads_and_writes() -> None:
    source = (
        "self._active.add('a')\n"
        "self._closing = True\n"
        "del self._tasks['a']\n"
        "x = self._started.get('a')\n"
        "self._unbound.discard(t)\n"
        "y = self._other\n"
    )
    assert sorted(_touches(source)) == [
        (1, "_active", True),
        (2, "_closing", True),
        (3, "_tasks", True),
        (4, "_started", False),
        (5, "_unbound", True),
    ]


@pytest.mark.parametrize("part", [p for p in PARTS if p != "_runs"])
def test_only_the_runs_touch_the_runs_in_flight(part: str) -> None:
    # Not even a read: the agent and its control ask ``PlanRuns`` (``is_active``, ``task``, ...).
    assert _touches((AGENTS / f"{part}.py").read_text()) == [], f"{part}.py touches them"


def test_the_runs_module_is_their_one_writer() -> None:
    written = {field for _, field, writes in _touches((AGENTS / "_runs.py").read_text()) if writes}
    assert written == {"_serving", "_tasks", "_started", "_unbound", "_closing"}


# --- every module of the package -------------------------------------------------------------

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
# No class of the package may descend from these: roles are composed, not inherited.
FORBIDDEN_BASES = frozenset({"Agent", "RoleAgent", "ModelPlanner"})
# Each planted source, and the classes the check must find in it (name -> the base it names).
PLANTS: dict[str, tuple[str, dict[str, str]]] = {
    "a role class over RoleAgent": (
        "class PerceptionAgent(RoleAgent):\n    spec = PERCEPTION_SPEC\n",
        {"PerceptionAgent": "RoleAgent"},
    ),
    "a subclass of Agent through another class": (
        "class Base(Agent): ...\nclass Critic(Base): ...\nclass Plain(BaseModel): ...\n",
        {"Base": "Agent", "Critic": "Base"},
    ),
    "a dotted base": (
        "class Own(_model_planner.ModelPlanner): ...\n",
        {"Own": "ModelPlanner"},
    ),
    "a base imported under another name": (
        "from stratagem.agents._agent import Agent as Base\nclass Own(Base): ...\n",
        {"Own": "Base"},
    ),
    "a base given another name": (
        "Base = RoleAgent\nclass Own(Base): ...\n",
        {"Own": "Base"},
    ),
    "a class made with type()": (
        "def make(spec):\n    return type('CriticAgent', (RoleAgent,), {'spec': spec})\n",
        {"CriticAgent": "RoleAgent"},
    ),
}


def _modules() -> list[Path]:
    return sorted(AGENTS.rglob("*.py"))


def _long_functions(source: str) -> list[tuple[str, int]]:
    """Each function (method, nested function) of ``source`` over ``MAX_FUNCTION_LINES``."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def _name(node: ast.expr) -> str:
    """The last part of a (dotted) name, else ``""``."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _bases(source: str) -> dict[str, list[str]]:
    """Class -> the names of its bases, for ``class`` statements and ``type(name, bases, ns)``
    calls (a class name given as a string)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            found[node.name] = [_name(base) for base in node.bases]
        elif (
            isinstance(node, ast.Call)
            and _name(node.func) == "type"
            and len(node.args) == 3
            and isinstance(node.args[1], ast.Tuple)
        ):
            name = node.args[0]
            label = name.value if isinstance(name, ast.Constant) else f"type@{node.lineno}"
            found[str(label)] = [_name(base) for base in node.args[1].elts]
    return found


def _aliases(source: str) -> set[str]:
    """Other names ``source`` gives a forbidden base (``import X as Y``, ``Y = X``)."""
    names = set(FORBIDDEN_BASES)
    tree = ast.parse(source)
    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            pairs: list[tuple[str, str]] = []
            if isinstance(node, ast.ImportFrom):
                pairs = [(a.name, a.asname) for a in node.names if a.asname]
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name | ast.Attribute):
                pairs = [(_name(node.value), _name(t)) for t in node.targets if _name(t)]
            for original, alias in pairs:
                if original in names and alias not in names:
                    names.add(alias)
                    grew = True
    return names


def _violations(*sources: str) -> dict[str, str]:
    """The classes of ``sources`` (read as one: a class may descend from one in another module)
    that descend from a forbidden base (``FORBIDDEN_BASES`` or another name for one), each with
    the base it names."""
    bases: dict[str, list[str]] = {}
    bad: set[str] = set()
    for source in sources:
        bases.update(_bases(source))
        bad |= _aliases(source)
    out: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for name, names in bases.items():
            hit = next((b for b in names if b in bad or b in out), None)
            if name not in out and hit is not None:
                out[name] = hit
                grew = True
    return out


def _package_violations(root: Path = AGENTS) -> dict[str, str]:
    return _violations(*(path.read_text() for path in sorted(root.rglob("*.py"))))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(AGENTS)))
def test_no_module_is_over_800_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name} has {lines} lines: split it by what it does"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(AGENTS)))
def test_no_function_is_over_100_lines(path: Path) -> None:
    assert _long_functions(path.read_text()) == []


def test_the_size_checks_see_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = f"class A:\n    async def long(self) -> None:\n{body.replace('    ', '        ')}\n"
    source += f"def short() -> None:\n{body[: body.index(chr(10)) + 1]}"
    assert _long_functions(source) == [("long", MAX_FUNCTION_LINES + 1)]


# --- roles by composition ---------------------------------------------------------------------


def test_no_class_of_the_package_subclasses_the_agent_or_the_model_planner() -> None:
    assert _package_violations() == {}


@pytest.mark.parametrize("plant", PLANTS, ids=str)
def test_the_inheritance_check_sees_a_planted_subclass(plant: str) -> None:
    source, expected = PLANTS[plant]
    assert _violations(source) == expected


def test_the_inheritance_check_sees_the_role_classes_as_they_were() -> None:
    # The package as it was before roles were data: role classes over RoleAgent over Agent.
    before = (
        "from stratagem.agents._agent import Agent\n"
        "class RoleAgent(Agent):\n    spec: ClassVar[RoleSpec]\n"
        "class TacticalAgent(RoleAgent):\n    spec = TACTICAL_SPEC\n"
    )
    assert _violations(before) == {"RoleAgent": "Agent", "TacticalAgent": "RoleAgent"}
    # Across modules: a class over a base another module defines.
    assert _violations("class RoleAgent(Agent): ...\n", "class Own(RoleAgent): ...\n") == {
        "RoleAgent": "Agent",
        "Own": "RoleAgent",
    }


def test_no_class_of_the_package_descends_from_them_at_run_time() -> None:
    # What the source check cannot see (a class made some other way), seen once it exists.
    for base in (Agent, ModelPlanner):
        ours = [c for c in base.__subclasses__() if c.__module__.startswith(PACKAGE)]
        assert ours == [], base.__name__
    assert RoleAgent is Agent  # the former name of the one agent class
    assert Agent.__mro__ == (Agent, object)


def test_each_role_model_answer_is_data() -> None:
    # The role modules of ``_model_roles`` declare no class: a role is a ``ModelAnswer`` value.
    for path in sorted((AGENTS / "_model_roles").glob("*.py")):
        assert _bases(path.read_text()) == {}, path.name
        assert not any(isinstance(n, ast.ClassDef) for n in ast.walk(ast.parse(path.read_text())))
    answers = (PERCEPTION_ANSWER, STRATEGIC_ANSWER, TACTICAL_ANSWER, ORCHESTRATOR_ANSWER)
    assert all(isinstance(answer, ModelAnswer) for answer in answers)
    assert all(dataclasses.is_dataclass(answer) for answer in answers)


ROLES = (PerceptionAgent, StrategicAgent, TacticalAgent, OrchestratorAgent)


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_each_built_in_role_is_data_built_into_the_one_agent(role: AgentRole[...]) -> None:
    # A role is a value (its spec and its build function), not a class; what it builds is an
    # ``Agent`` itself, which ``isinstance`` still tells apart by role.
    assert not isinstance(role, type)
    assert dataclasses.is_dataclass(role)
    assert isinstance(role.spec, RoleSpec)
    assert ROLE_TYPES[role.spec.role] is role
    agent = role()
    assert type(agent) is Agent
    assert isinstance(agent, role)
    assert [other for other in ROLES if isinstance(agent, other)] == [role]
