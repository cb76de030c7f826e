"""Plan validation: every rule a plan must satisfy before an engine runs it.

``validate_plan`` collects every problem before it raises, so a planner (or a person) sees all that
is wrong with a plan at once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from stratagem.planning._dag import structural_problems
from stratagem.planning._errors import (
    ExpressionError,
    PlanValidationError,
    RefError,
    field_problems,
)
from stratagem.planning._expr import expression, kind_of, list_kind
from stratagem.planning._kinds import runs_items, step_kind
from stratagem.planning._plan import (
    LOOP_ITERATION,
    LOOP_LAST,
    LoopStep,
    MapStep,
    Plan,
    Step,
    StepBase,
    SubplanStep,
)
from stratagem.planning._refs import REF_KEY, Ref, iter_markers
from stratagem.protocol import CAPABILITIES, CapabilitySpec
from stratagem.protocol import roles as registered_roles

__all__ = ["validate_plan"]

logger = logging.getLogger(__name__)


def validate_plan(
    plan: Plan,
    *,
    tools: Collection[str],
    roles: Collection[str] | None = None,
    capabilities: Mapping[str, CapabilitySpec] | None = None,
) -> None:
    """Check a plan against the structural rules and the owning agent's registry.

    The rules: step ids are unique; dependencies name steps of the plan and form no cycle; a tool
    step names a tool of the owner's registry; a cross-agent step targets a known role other than
    the owner, with a capability that role serves; a cross-agent request without references
    validates against the capability's request model (one with references has no unknown fields);
    every ``$ref`` parses and names a (transitive) dependency of its step, and every expression
    (``{"$expr": ...}``) parses, calls JMESPath's functions rightly and reads only (transitive)
    dependencies of its step and the plan's inputs, and so does a step's condition (``when``); a
    step that runs on failure depends on some step; a compensating tool is
    in the owner's registry, its input's references name the step itself or a (transitive)
    dependency, and a gate has no compensation; a gate does not retry, asks with a valid JSON
    Schema or distinct choices (not both), and its ``on_timeout``, ``default`` and escalation
    fit together (a default fits what the gate asks; whoever it escalates to is named).

    Dynamic steps too, expansions included: a map's tool (or request) passes the rules of a tool
    (or cross-agent) step, its expressions may also read ``item`` and ``index``, its list
    (``over``) must be able to give a list (a comparison, a number, ... cannot) and, when it
    reads only the plan's inputs, is evaluated: a list longer than ``max_items`` is refused. A
    loop needs a bound (``max_iterations`` or ``timebox_s``) and its ``until`` reads only its
    body's steps and inputs; the body of a loop or a sub-plan passes every rule as a plan of the
    same owner (nested at most ``MAX_DEPTH`` deep), its ``inputs`` read the step's dependencies.

    Args:
        plan: The plan.
        tools: The names of the tools in the owning agent's registry.
        roles: The roles a cross-agent step may target; by default every role known in this
            process (``protocol.roles()``: the built-in ones and extensions' agents) and every
            role serving a capability.
        capabilities: Capability name -> spec; by default the protocol's registry.

    Raises:
        PlanValidationError: With every problem found, one sentence each.
    """
    caps: Mapping[str, CapabilitySpec] = CAPABILITIES if capabilities is None else capabilities
    known_roles = (
        set(roles)
        if roles is not None
        else {*registered_roles(), *(spec.role for spec in caps.values())}
    )
    rules = _Rules(plan.owner, set(tools), known_roles, caps)
    problems = _steps_problems(rules, plan.steps, plan.inputs, 0)
    if problems:
        logger.debug("plan %s@%d is invalid: %s", plan.id, plan.revision, problems)
        raise PlanValidationError(problems)


MAX_DEPTH: Final = 3
"""How deep loops and sub-plans may nest (a body's loop is one level deeper)."""

_BOUND: Final = frozenset({"item", "index"})  # what a map's expressions read besides steps


@dataclass(frozen=True, slots=True)
class _Rules:
    """What a plan is checked against: its owner and the owner's tools, the roles, capabilities."""

    owner: str
    tools: Collection[str]
    roles: Collection[str]
    caps: Mapping[str, CapabilitySpec]


def _steps_problems(
    rules: _Rules, steps: list[Step], inputs: Mapping[str, Any] | None, depth: int
) -> list[str]:
    """The problems of a plan's steps (or a body's); ``inputs``: the plan's inputs when known."""
    problems = structural_problems(steps)
    deps = {step.id: step.depends_on for step in steps}
    ids = set(deps)
    checks = _Checks(rules, deps, ids, inputs, depth)
    for step in steps:
        # Dispatched through the step's row of ``KINDS``: the fields its kind does not honour
        # are refused, then the kind checks what it reads.
        row = step_kind(step)
        problems.extend(row.refused(step))
        problems.extend(row.validate(checks, step))
    for step in steps:
        problems.extend(_condition_problems(step, deps))
    return problems


@dataclass(frozen=True, slots=True)
class _Checks:
    """The rules a kind's ``validate`` applies to a step of a plan (or of a body): ``Checks``."""

    rules: _Rules
    deps: Mapping[str, list[str]]
    ids: Collection[str]
    inputs: Mapping[str, Any] | None
    depth: int

    def tool(self, step: StepBase, tool: str) -> list[str]:
        return _tool_problems(self.rules, step, tool)

    def request(
        self, step: StepBase, target: str, capability: str, request: dict[str, Any]
    ) -> list[str]:
        return _cross_agent_problems(self.rules, step, target, capability, request, self.deps)

    def refs(self, step: StepBase, value: Any) -> list[str]:
        return _ref_problems(step, value, self.deps)

    def compensation(self, step: StepBase) -> list[str]:
        return _compensation_problems(self.rules, step, self.deps)

    def items(self, step: MapStep) -> list[str]:
        return _map_problems(self.rules, step, self.deps, self.ids, self.inputs)

    def plans(self, step: LoopStep | SubplanStep) -> list[str]:
        return _nested_problems(self.rules, step, self.deps, self.depth)


def _tool_problems(rules: _Rules, step: StepBase, tool: str) -> list[str]:
    if tool in rules.tools:
        return []
    return [
        f"step {step.id!r} uses tool {tool!r}, which is not in the {rules.owner} agent's registry"
    ]


def _map_problems(
    rules: _Rules,
    step: MapStep,
    deps: Mapping[str, list[str]],
    ids: Collection[str],
    inputs: Mapping[str, Any] | None,
) -> list[str]:
    """Problems with a map: its list, its work per item (its expansion), its bounds."""
    problems: list[str] = []
    found = _expression_steps(step, step.over, "list ('over')")
    if isinstance(found, list):
        problems.extend(found)
    else:
        problems.extend(
            p.replace(f"step {step.id!r}", f"step {step.id!r} list", 1)
            for p in _reading_problems(step, step.over, found, deps, step.id)
        )
        kind = list_kind(step.over)
        if kind is not None:
            problems.append(
                f"step {step.id!r} maps over {kind}, not a list ('over': {step.over!r})"
            )
        elif not found and inputs is not None:  # it reads only the plan's inputs: known now
            try:
                values = expression(step.over).evaluate({}, inputs, max_items=step.max_items)
            except ExpressionError as exc:
                problems.append(f"step {step.id!r} has an invalid list ('over'): {exc}")
            else:
                if not isinstance(values, list):
                    problems.append(
                        f"step {step.id!r} maps over {kind_of(values)}, not a list "
                        f"('over': {step.over!r})"
                    )
                elif len(values) > step.max_items:
                    problems.append(
                        f"step {step.id!r} maps over {len(values)} items, more than its "
                        f"max_items {step.max_items}"
                    )
    if step.tool is not None:
        problems.extend(_tool_problems(rules, step, step.tool))
        problems.extend(_ref_problems(step, step.input, deps, bound=_BOUND))
        template: Any = step.input
    elif step.target is not None and step.capability is not None:
        problems.extend(
            _cross_agent_problems(
                rules, step, step.target, step.capability, step.request, deps, bound=_BOUND
            )
        )
        template = step.request
    shadowed = sorted(_reads(template) & _BOUND & set(ids))
    if shadowed:
        problems.append(
            f"step {step.id!r} reads {shadowed[0]!r}, which is its item here, not the step "
            f"{shadowed[0]!r}: rename that step"
        )
    return problems


def _nested_problems(
    rules: _Rules, step: LoopStep | SubplanStep, deps: Mapping[str, list[str]], depth: int
) -> list[str]:
    """Problems with a loop or a sub-plan: its bound, ``until``, inputs and body."""
    problems: list[str] = []
    if depth + 1 > MAX_DEPTH:
        problems.append(f"step {step.id!r} nests plans more than {MAX_DEPTH} levels deep")
    problems.extend(_ref_problems(step, step.inputs, deps))
    body = {inner.id for inner in step.steps}
    if isinstance(step, LoopStep):
        if step.max_iterations is None and step.timebox_s is None:
            problems.append(
                f"step {step.id!r} is a loop without a bound: give max_iterations, timebox_s "
                f"or both"
            )
        reserved = sorted({LOOP_ITERATION, LOOP_LAST} & set(step.inputs))
        if reserved:
            problems.append(
                f"step {step.id!r} has an input {reserved[0]!r}, which the loop sets itself "
                f"(inputs.{LOOP_ITERATION}, inputs.{LOOP_LAST})"
            )
        if step.until is not None:
            found = _expression_steps(step, step.until, "condition ('until')")
            if isinstance(found, list):
                problems.extend(found)
            else:
                problems.extend(
                    f"step {step.id!r} until reads {name!r}, which is not a step of its body "
                    f"({', '.join(sorted(body))})"
                    for name in sorted(found - body)
                )
    prefix = f"step {step.id!r} body: "
    if depth + 1 <= MAX_DEPTH:
        problems.extend(prefix + p for p in _steps_problems(rules, step.steps, None, depth + 1))
    return problems


def _reads(value: Any) -> set[str]:
    """The top-level names the expressions in ``value`` read (nothing when one is invalid)."""
    names: set[str] = set()
    try:
        for key, text in iter_markers(value):
            if key != REF_KEY:
                names |= expression(text).steps
    except (ExpressionError, RefError):
        return set()
    return names


def _cross_agent_problems(
    rules: _Rules,
    step: StepBase,
    target: str,
    capability: str,
    request: dict[str, Any],
    deps: Mapping[str, list[str]],
    *,
    bound: frozenset[str] = frozenset(),
) -> list[str]:
    problems: list[str] = []
    ref_problems = _ref_problems(step, request, deps, bound=bound)
    spec: CapabilitySpec | None = None
    caps = rules.caps
    if target == rules.owner:
        problems.append(
            f"step {step.id!r} targets its own agent ({rules.owner!r}); use one of its tools "
            f"instead"
        )
    elif target not in rules.roles:
        problems.append(f"step {step.id!r} targets unknown role {target!r}")
    else:
        spec = caps.get(capability)
        if spec is None or spec.role != target:
            served = sorted(name for name, s in caps.items() if s.role == target)
            problems.append(
                f"step {step.id!r} asks the {target} agent for capability "
                f"{capability!r}, which that role does not serve "
                f"(it serves: {', '.join(served) or 'nothing'})"
            )
            spec = None
    if spec is not None:
        has_refs = _has_refs(request)
        if not has_refs:
            try:
                spec.request.model_validate(request)
            except ValidationError as exc:
                problems.extend(
                    f"step {step.id!r} request for {spec.name}: {problem}"
                    for problem in field_problems(exc)
                )
        else:
            known = spec.request.model_fields
            problems.extend(
                f"step {step.id!r} request for {spec.name}: {key}: Extra inputs are not permitted"
                for key in request
                if key not in known
            )
    return problems + ref_problems


def _compensation_problems(
    rules: _Rules, step: StepBase, deps: Mapping[str, list[str]]
) -> list[str]:
    problems: list[str] = []
    if step.compensate is None:
        if step.compensate_input is not None:
            problems.append(f"step {step.id!r} has compensate_input but no compensate tool")
        return problems
    if step.compensate not in rules.tools:
        problems.append(
            f"step {step.id!r} is compensated by tool {step.compensate!r}, which is not in the "
            f"{rules.owner} agent's registry"
        )
    if step.compensate_input is not None:
        # The compensation runs after the step, so it may also reference the step's own output
        # (a map's item: its item and index).
        own = {**deps, "": [step.id, *deps.get(step.id, [])]}
        bound = _BOUND if runs_items(step) else frozenset()
        for problem in _ref_problems(step, step.compensate_input, own, owner="", bound=bound):
            problems.append(
                problem.replace(f"step {step.id!r}", f"step {step.id!r} compensation", 1)
            )
    return problems


def _condition_problems(step: StepBase, deps: Mapping[str, list[str]]) -> list[str]:
    """Problems with a step's ``when`` and ``runs_on``."""
    problems: list[str] = []
    if step.runs_on == "failure" and not step.depends_on:
        problems.append(
            f"step {step.id!r} runs on failure but depends on no step: name the steps whose "
            f"failure it handles in depends_on"
        )
    if step.when is not None:
        found = _expression_steps(step, step.when, "condition")
        if isinstance(found, list):
            problems.extend(found)
        else:
            problems.extend(
                p.replace(f"step {step.id!r}", f"step {step.id!r} condition", 1)
                for p in _reading_problems(step, step.when, found, deps, step.id)
            )
    return problems


def _has_refs(value: Any) -> bool:
    try:
        return next(iter_markers(value), None) is not None
    except RefError:
        return True


def _ref_problems(
    step: StepBase,
    value: Any,
    deps: Mapping[str, list[str]],
    *,
    owner: str | None = None,
    bound: frozenset[str] = frozenset(),
) -> list[str]:
    """Problems with the references and expressions in ``value``; they must read only
    dependencies of ``owner`` (and the names ``bound``: a map's ``item`` and ``index``).

    ``owner`` defaults to the step's id.
    """
    owner = step.id if owner is None else owner
    problems: list[str] = []
    try:
        markers = list(iter_markers(value))
    except ExpressionError as exc:
        return [f"step {step.id!r} has an invalid expression: {exc}"]
    except RefError as exc:
        return [f"step {step.id!r} has an invalid reference: {exc}"]
    for key, text in markers:
        if key == REF_KEY:
            try:
                targets = {Ref.parse(text).step_id}
            except RefError as exc:
                problems.append(f"step {step.id!r} has an invalid reference: {exc}")
                continue
        else:
            found = _expression_steps(step, text)
            if isinstance(found, list):
                problems.extend(found)
                continue
            targets = found - bound
        problems.extend(_reading_problems(step, text, targets, deps, owner))
    return problems


def _expression_steps(step: StepBase, text: str, what: str = "expression") -> list[str] | set[str]:
    """The steps expression ``text`` reads, or its problems when it does not parse."""
    try:
        return set(expression(text).steps)
    except ExpressionError as exc:
        return [f"step {step.id!r} has an invalid {what}: {exc}"]


def _reading_problems(
    step: StepBase, text: str, targets: set[str], deps: Mapping[str, list[str]], owner: str
) -> list[str]:
    """Problems with ``text`` reading ``targets``: each must be a dependency of ``owner``."""
    problems: list[str] = []
    for target in sorted(targets):
        if target not in deps:
            problems.append(f"step {step.id!r} references unknown step {target!r} in {text!r}")
        elif not _depends_on(owner, target, deps):
            problems.append(
                f"step {step.id!r} references step {target!r} in {text!r}, which is not among "
                f"its (transitive) dependencies"
            )
    return problems


def _depends_on(step_id: str, target: str, deps: Mapping[str, list[str]]) -> bool:
    """Whether ``target`` is a transitive dependency of ``step_id`` (cycle-safe)."""
    direct = deps.get(step_id, [])
    if target in direct:
        return True
    seen = {step_id}
    stack = list(direct)
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(deps.get(current, []))
    return False
