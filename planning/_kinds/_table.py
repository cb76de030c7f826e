"""``KINDS``: every step kind, declared once, one row per kind module.

A new kind is one model in ``planning/_plan.py`` (a member of the ``Step`` union), one module
here with its ``KIND`` row, and that row below; ``tests/unit/planning/test_kinds_structure.py``
checks that the table and the union name the same kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, TypeGuard

from stratagem.planning._kinds._agent import KIND as AGENT
from stratagem.planning._kinds._gate import KIND as GATE
from stratagem.planning._kinds._kind import StepKind
from stratagem.planning._kinds._loop import KIND as LOOP
from stratagem.planning._kinds._map import KIND as MAP
from stratagem.planning._kinds._subplan import KIND as SUBPLAN
from stratagem.planning._kinds._tool import KIND as TOOL
from stratagem.planning._plan import (
    GateStep,
    LoopStep,
    MapStep,
    Step,
    StepBase,
    SubplanStep,
    ToolStep,
)

KINDS: Final[Mapping[str, StepKind]] = MappingProxyType(
    {row.name: row for row in (TOOL, AGENT, GATE, MAP, LOOP, SUBPLAN)}
)
"""The step kinds by their ``kind`` discriminator."""


def step_kind(step: StepBase) -> StepKind:
    """The row of ``step``'s kind."""
    return KINDS[step.kind]


def attempts_tool(step: StepBase) -> TypeGuard[ToolStep]:
    """Whether each attempt of ``step`` calls a tool of the owner's registry (a tool step)."""
    row = KINDS[step.kind]
    return row.start == "attempt" and row.tool(step) is not None


def is_decided(step: StepBase) -> TypeGuard[GateStep]:
    """Whether ``step`` is decided by a person rather than attempted (a gate)."""
    return KINDS[step.kind].start == "decide"


def runs_items(step: StepBase) -> TypeGuard[MapStep]:
    """Whether ``step`` runs one unit of work per item (a map)."""
    return KINDS[step.kind].start == "items"


def runs_plans(step: StepBase) -> TypeGuard[LoopStep | SubplanStep]:
    """Whether ``step`` runs its body as nested plans (a loop, a sub-plan)."""
    return KINDS[step.kind].start == "plans"


def is_expanded(step: StepBase) -> TypeGuard[MapStep | LoopStep | SubplanStep]:
    """Whether ``step`` is expanded (into items or nested plans) rather than attempted."""
    return KINDS[step.kind].expanded


def tool_of(step: StepBase) -> str | None:
    """The tool of the owner's registry ``step`` calls (``None``: it calls none)."""
    return KINDS[step.kind].tool(step)


def body_of(step: StepBase) -> Sequence[Step]:
    """The steps ``step`` nests (its body; empty for a kind without one)."""
    return KINDS[step.kind].body(step)
