"""What a gate is, apart from the run: the rule its deadline follows, an open gate's state,
what a decision may carry, and the prompts of the gates the engine opens itself.

``_gates._Gates`` (the run's gates) and ``_engine.Engine`` (a stored plan's decisions) use it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stratagem.planning._engine._types import ToolApproval, ToolRunner
from stratagem.planning._errors import GateDecisionError, GateValueError
from stratagem.planning._gate_input import value_problem
from stratagem.planning._kinds import is_decided, step_kind
from stratagem.planning._plan import (
    GateStep,
    Step,
    ToolStep,
)
from stratagem.planning._store import GateKind, GateState

# The longest arguments shown in a tool gate's prompt.
_SHOWN_ARGUMENTS = 1000


@dataclass(frozen=True, slots=True)
class Rule:
    """What an open gate's deadline and escalation do, from its gate step or tool approval."""

    timeout_s: float | None = None
    on_timeout: Literal["reject", "approve", "default", "escalate"] = "reject"
    default: Any = None
    escalate_after_s: float | None = None
    escalate_to: tuple[str, ...] = ()


@dataclass(slots=True)
class Open:
    """An open gate, as the gates know it (the state knows only that it is open)."""

    kind: GateKind
    prompt: str
    at: float
    deciders: tuple[str, ...] = ()
    deadline: float | None = None
    escalate_at: float | None = None
    escalated: bool = False
    rule: Rule | None = None
    tool: str = ""
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Edit:
    """An approval that edited a tool step's arguments: the plan goes on as a new revision."""

    step_id: str
    arguments: dict[str, Any]
    approver: str
    rationale: str


def check_decision_input(
    plan_id: str,
    revision: int,
    step: Step,
    kind: GateKind,
    *,
    approve: bool,
    output: dict[str, Any] | None,
    value: Any,
    has_value: bool,
    arguments: dict[str, Any] | None,
    tools: ToolRunner | None,
) -> None:
    """What a decision carries must fit its gate: an output only for a reconcile or policy gate,
    a value only for an approval of a gate step that asks one (and fitting it), edited arguments
    only for an approval of a tool gate (fitting the tool's input).

    Raises:
        GateDecisionError: What does not fit (``GateValueError`` for a value or arguments).
    """
    gate_id = step.id
    if output is not None and kind in (GateKind.GATE, GateKind.TOOL):
        raise GateDecisionError(
            plan_id, gate_id, revision, "an output may only be given to a reconcile gate"
        )
    if arguments is not None and not (kind is GateKind.TOOL and approve):
        raise GateDecisionError(
            plan_id,
            gate_id,
            revision,
            "edited arguments may only come with the approval of a tool's approval gate",
        )
    if kind is GateKind.GATE and is_decided(step) and approve:
        problem = value_problem(step, value, has_value)
        if problem is not None:
            raise GateValueError(plan_id, gate_id, revision, *problem)
    elif has_value:
        raise GateDecisionError(
            plan_id,
            gate_id,
            revision,
            "a value may only come with the approval of a gate that asks one",
        )
    if arguments is not None and isinstance(step, ToolStep) and tools is not None:
        problems = getattr(tools, "input_problems", None)
        found = problems(step.tool, arguments) if callable(problems) else []
        if found:
            field, _, reason = str(found[0]).partition(": ")
            raise GateValueError(
                plan_id,
                gate_id,
                revision,
                f"arguments.{field}" if reason else "arguments",
                reason or str(found[0]),
            )


def take_recorded(gate: Open, found: GateState) -> None:
    """A gate found open takes what its opening recorded (its deadline runs from then)."""
    gate.prompt = found.prompt or gate.prompt
    gate.at = found.opened_at if found.opened_at is not None else gate.at
    gate.deciders = found.deciders
    gate.deadline = found.deadline
    gate.escalate_at = found.escalate_at
    gate.escalated = found.escalated
    if found.arguments is not None:
        gate.arguments = found.arguments


def gate_rule(step: GateStep) -> Rule | None:
    if step.timeout_s is None and step.escalate_after_s is None:
        return None
    return Rule(
        step.timeout_s,
        step.on_timeout,
        step.default,
        step.escalate_after_s,
        tuple(step.escalate_to),
    )


def tool_rule(approvals: Sequence[ToolApproval], tool: str) -> Rule | None:
    for rule in approvals:
        if rule.tool == tool:
            return Rule(
                rule.timeout_s, rule.on_timeout, None, rule.escalate_after_s, rule.escalate_to
            )
    return None


def step_deciders(step: Step | None) -> tuple[str, ...]:
    return tuple(step.deciders) if step is not None and is_decided(step) else ()


def seconds(rule: Rule | None, what: Literal["escalate", "expire"]) -> str:
    if rule is None:
        return "its time"
    seconds = rule.escalate_after_s if what == "escalate" else rule.timeout_s
    return f"{seconds:g}s" if seconds is not None else "its time"


def tool_prompt(step: ToolStep, rule: ToolApproval, arguments: dict[str, Any]) -> str:
    shown = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    if len(shown) > _SHOWN_ARGUMENTS:
        shown = shown[:_SHOWN_ARGUMENTS] + "..."
    asked = f"{rule.prompt}: " if rule.prompt else ""
    return (
        f"{asked}step {step.id!r} calls tool {step.tool!r} with {shown}; approve to run it "
        f"(or approve with edited arguments), reject to fail it"
    )


def reconcile_prompt(step: Step) -> str:
    what = step_kind(step).named(step)
    return f"{what} was in flight when the plan stopped; approve to re-run it, reject to fail it"
