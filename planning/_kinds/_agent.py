"""The ``cross_agent`` kind: send a typed request to another agent's capability."""

from __future__ import annotations

from typing import Any

from stratagem.planning._kinds._kind import Checks, StepKind
from stratagem.planning._plan import CrossAgentStep


def _named(step: CrossAgentStep) -> str:
    return f"step {step.id!r} ({step.target}.{step.capability})"


def _sends(step: CrossAgentStep) -> dict[str, Any]:
    return step.request


def _validate(checks: Checks, step: CrossAgentStep) -> list[str]:
    return [
        *checks.request(step, step.target, step.capability, step.request),
        *checks.compensation(step),
    ]


KIND = StepKind(
    name="cross_agent",
    model=CrossAgentStep,
    what="a cross-agent step",
    start="attempt",
    validate=_validate,
    sends=_sends,
    named=_named,
)
