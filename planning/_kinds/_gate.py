"""The ``gate`` kind: a person decides; nothing is attempted, so nothing retries or is undone."""

from __future__ import annotations

from stratagem.planning._gate_input import choices_problem, schema_problem, value_problem
from stratagem.planning._kinds._kind import Checks, Refusal, StepKind
from stratagem.planning._plan import GateStep


def _named(step: GateStep) -> str:
    return f"gate {step.id!r}"


def _validate(checks: Checks, step: GateStep) -> list[str]:
    """Problems with what a gate asks, its time limit and who decides it: what a gate cannot
    use is refused rather than ignored."""
    gate = f"gate {step.id!r}"
    problems: list[str] = []
    if step.input_schema is not None and step.choices is not None:
        problems.append(f"{gate} asks with input_schema or with choices, not both")
    if step.input_schema is not None:
        problem = schema_problem(step.input_schema)
        if problem is not None:
            problems.append(f"{gate} input_schema is not a valid JSON Schema: {problem}")
    if step.choices is not None:
        problem = choices_problem(step.choices)
        if problem is not None:
            problems.append(f"{gate} choices: {problem}")
    if step.timeout_s is None:
        if step.on_timeout != "reject":
            problems.append(f"{gate} has on_timeout but no timeout_s")
    elif step.on_timeout == "approve" and step.asks:
        problems.append(
            f"{gate} asks a value, so on_timeout 'approve' has none to give: use on_timeout "
            f"'default' with a default value"
        )
    if step.on_timeout == "default":
        if not step.asks:
            problems.append(
                f"{gate} asks no value (no input_schema, no choices): use on_timeout 'approve'"
            )
        elif step.input_schema is None or schema_problem(step.input_schema) is None:
            unfit = value_problem(step, step.default, True)
            if unfit is not None:
                problems.append(f"{gate} default does not fit the gate: {': '.join(unfit)}")
    elif step.default is not None:
        problems.append(f"{gate} has a default value but on_timeout is not 'default'")
    escalates = step.escalate_after_s is not None or step.on_timeout == "escalate"
    if escalates and not step.escalate_to:
        problems.append(f"{gate} escalates but names no one in escalate_to")
    if step.escalate_to and not escalates:
        problems.append(
            f"{gate} has escalate_to but never escalates (set escalate_after_s, or on_timeout "
            f"'escalate')"
        )
    if (
        step.escalate_after_s is not None
        and step.timeout_s is not None
        and step.escalate_after_s >= step.timeout_s
    ):
        problems.append(
            f"{gate} escalate_after_s ({step.escalate_after_s:g}) must be less than its "
            f"timeout_s ({step.timeout_s:g})"
        )
    return problems


KIND = StepKind(
    name="gate",
    model=GateStep,
    what="a gate",
    start="decide",
    validate=_validate,
    named=_named,
    refuses=(
        Refusal(("compensate", "compensate_input"), "gate {id} cannot have a compensation"),
        Refusal(
            ("retry",),
            "gate {id} cannot retry: a gate is decided, not attempted (use timeout_s and "
            "on_timeout)",
        ),
        Refusal(
            ("on_policy_failure",),
            "gate {id} cannot have on_policy_failure: a gate fails no policy check",
        ),
    ),
)
