"""The ``map`` kind: one unit of work per item of a list known at run time."""

from __future__ import annotations

from typing import Any

from stratagem.planning._kinds._kind import Checks, Refusal, StepKind
from stratagem.planning._plan import MapStep


def _tool(step: MapStep) -> str | None:
    return step.tool


def _sends(step: MapStep) -> dict[str, Any]:
    return step.input if step.tool is not None else step.request


def _validate(checks: Checks, step: MapStep) -> list[str]:
    return [*checks.items(step), *checks.compensation(step)]


KIND = StepKind(
    name="map",
    model=MapStep,
    what="a map",
    start="items",
    validate=_validate,
    refuses=(
        Refusal(
            ("on_policy_failure",),
            "step {id} is a map: on_policy_failure 'gate' is for tool and cross-agent steps",
        ),
    ),
    tool=_tool,
    sends=_sends,
)
