"""The ``tool`` kind: call one of the owning agent's tools, attempt by attempt."""

from __future__ import annotations

from typing import Any

from stratagem.planning._kinds._kind import Checks, StepKind
from stratagem.planning._plan import ToolStep


def _tool(step: ToolStep) -> str:
    return step.tool


def _named(step: ToolStep) -> str:
    return f"step {step.id!r} (tool {step.tool!r})"


def _sends(step: ToolStep) -> dict[str, Any]:
    return step.input


def _validate(checks: Checks, step: ToolStep) -> list[str]:
    return [
        *checks.tool(step, step.tool),
        *checks.refs(step, step.input),
        *checks.compensation(step),
    ]


KIND = StepKind(
    name="tool",
    model=ToolStep,
    what="a tool step",
    start="attempt",
    validate=_validate,
    tool=_tool,
    sends=_sends,
    named=_named,
)
