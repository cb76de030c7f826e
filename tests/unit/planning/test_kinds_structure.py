"""Step kinds have a home: ``KINDS`` (``planning/_kinds``), one module and one row per kind.

The table names the same kinds as the ``Step`` union, each row declared in its own module; what a
kind refuses is declared on its row and is what validation refuses; code outside
``planning/_kinds`` asks the table rather than testing ``isinstance`` on a step class (counted
from the source with ``ast``, against an allow-list that may only shrink); and a toy kind added
in a test, with one row, is validated through the table without touching another file.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import pytest

from stratagem.planning import Plan, PlanValidationError, Step, StepBase, validate_plan
from stratagem.planning._engine._policy import step_is_idempotent
from stratagem.planning._kinds import KINDS, Checks, Refusal, StepKind, _table, step_kind, tool_of

from .test_step_fields import EVIDENCE, Refused

ROOT = Path(__file__).resolve().parents[3]
KINDS_DIR = ROOT / "planning" / "_kinds"
STEP_CLASSES = frozenset(
    {"ToolStep", "CrossAgentStep", "GateStep", "MapStep", "LoopStep", "SubplanStep", "StepBase"}
)

# isinstance checks (and ``case XStep()`` patterns) on step classes allowed outside
# planning/_kinds. planning/ by file: a count above its allowance fails, and so does one below
# it (shrink the list). The other packages are other parts' to move: by package, a ceiling.
ALLOWED_IN_PLANNING: dict[str, int] = {
    "planning/_engine/_attempts.py": 6,  # the attempt body: a tool call or a request
    "planning/_engine/_fork.py": 2,  # an output checked against the tool's or the capability's
    "planning/_engine/_gate_model.py": 1,  # a tool gate's edited arguments
    "planning/_engine/_gates.py": 1,  # a tool gate's step
    "planning/_engine/_nested.py": 9,  # a loop or a sub-plan: the nested kinds' own runner
    "planning/_engine/_run.py": 1,
    "planning/_replay.py": 1,  # a loop's iterations apart from a sub-plan's attempts
    "planning/_validate.py": 1,  # a loop's bound and until, in the nested kinds' checks
}
# agents: 19 with the goal planner's one check of its own plan's cross-agent steps.
CEILING_ELSEWHERE: dict[str, int] = {"agents": 19, "runtime": 1}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def step_class_checks(source: str) -> int:
    """How many ``isinstance(x, <step class>)`` calls and ``case <StepClass>()`` patterns."""
    found = 0
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
            and _names(node.args[1]) & STEP_CLASSES
        ) or (isinstance(node, ast.MatchClass) and _names(node.cls) & STEP_CLASSES):
            found += 1
    return found


def _counts(package: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if KINDS_DIR in path.parents or "_gen" in path.parts:
            continue
        found = step_class_checks(path.read_text())
        if found:
            counts[path.relative_to(ROOT).as_posix()] = found
    return counts


def _union() -> dict[str, type[StepBase]]:
    members = typing.get_args(typing.get_args(Step)[0])
    return {model.model_fields["kind"].default: model for model in members}


def test_the_table_and_the_union_name_the_same_kinds() -> None:
    union = _union()
    assert set(KINDS) == set(union)
    for name, row in KINDS.items():
        assert row.name == name
        assert row.model is union[name]


def test_each_kind_is_declared_in_a_module_of_its_own() -> None:
    declared: dict[str, str] = {}
    for path in sorted(KINDS_DIR.glob("_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "KIND" for t in node.targets
            ):
                assert isinstance(node.value, ast.Call)
                [name] = [k.value for k in node.value.keywords if k.arg == "name"]
                assert isinstance(name, ast.Constant)
                assert name.value not in declared, (name.value, path.name, declared)
                declared[name.value] = path.name
    assert set(declared) == set(KINDS)
    assert len(set(declared.values())) == len(declared)  # one module per kind


def test_what_a_row_refuses_is_what_the_field_table_says_is_refused() -> None:
    for name, row in KINDS.items():
        refused = {field for r in row.refuses for field in r.fields}
        evidence = {f for f, e in EVIDENCE[name].items() if isinstance(e, Refused)}
        assert refused == evidence, name
        assert row.compensable == ("compensate" not in refused), name


def test_the_counter_sees_isinstance_checks_and_class_patterns() -> None:
    source = (
        "isinstance(step, ToolStep)\n"
        "isinstance(step, LoopStep | SubplanStep)\n"
        "isinstance(step, (plan.MapStep, int))\n"
        "isinstance(record, StepResult)\n"
        "match step:\n"
        "    case GateStep() | CrossAgentStep():\n"
        "        pass\n"
        "    case int():\n"
        "        pass\n"
    )
    assert step_class_checks(source) == 5
    assert step_class_checks("is_decided(step)\nKINDS[step.kind].start\n") == 0


def test_planning_asks_the_table_not_isinstance_on_step_classes() -> None:
    counts = _counts("planning")
    over = {p: n for p, n in counts.items() if n > ALLOWED_IN_PLANNING.get(p, 0)}
    assert not over, f"isinstance on step classes outside planning/_kinds: {over}"
    stale = {p: n for p, n in ALLOWED_IN_PLANNING.items() if counts.get(p, 0) < n}
    assert not stale, f"fewer checks than allowed, shrink ALLOWED_IN_PLANNING: {stale}"


@pytest.mark.parametrize("package", sorted(CEILING_ELSEWHERE))
def test_other_packages_add_no_isinstance_on_step_classes(package: str) -> None:
    found = sum(_counts(package).values())
    assert found <= CEILING_ELSEWHERE[package], f"{package}: {_counts(package)}"


# --- a toy kind: one model, one row, nothing else ------------------------------------------------


class ToyStep(StepBase):
    """A kind made up here: it says ``word``, which must not be empty; it cannot time out."""

    kind: Literal["toy"] = "toy"
    word: str = ""


def _toy_problems(checks: Checks, step: ToyStep) -> list[str]:
    return [] if step.word else [f"step {step.id!r} is a toy with no word"]


TOY = StepKind(
    name="toy",
    model=ToyStep,
    what="a toy",
    start="attempt",
    validate=_toy_problems,
    refuses=(Refusal(("timeout_s",), "step {id} is a toy: it has no timeout_s"),),
)


@pytest.fixture
def toy_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_table, "KINDS", MappingProxyType({**KINDS, "toy": TOY}))


def _plan(*steps: StepBase) -> Plan:
    # The Step union is closed at import: a plan holding the toy is built without parsing.
    return Plan.model_construct(id="p", owner="t", goal="g", steps=list(steps), inputs={})


@pytest.mark.usefixtures("toy_kind")
def test_a_toy_kind_is_one_row_and_validation_dispatches_to_it() -> None:
    toy = ToyStep(id="a", word="hi")
    validate_plan(_plan(toy), tools=set())
    assert step_kind(toy) is TOY
    assert tool_of(toy) is None

    class NoTools:
        def is_idempotent(self, tool: str) -> bool:
            raise AssertionError("a toy calls no tool")

    assert step_is_idempotent(toy, NoTools())  # type: ignore[arg-type]
    bad = ToyStep(id="b", word="", timeout_s=3.0, depends_on=["a"])
    with pytest.raises(PlanValidationError) as info:
        validate_plan(_plan(toy, bad), tools=set())
    assert info.value.problems == [
        "step 'b' is a toy: it has no timeout_s",  # refused, from its row
        "step 'b' is a toy with no word",  # its own check, through its row
    ]
