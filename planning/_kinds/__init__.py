"""Step kinds: one module per kind and ``KINDS``, the table the engine and validation read.

Each kind's module declares its row (``StepKind``): how the scheduler starts a step of it, the
shared fields it does not honour (refused by validation), the tool it calls, the steps it nests.
"""

from stratagem.planning._kinds._kind import Checks, Refusal, Start, StepKind
from stratagem.planning._kinds._table import (
    KINDS,
    attempts_tool,
    body_of,
    is_decided,
    is_expanded,
    runs_items,
    runs_plans,
    step_kind,
    tool_of,
)

__all__ = [
    "KINDS",
    "Checks",
    "Refusal",
    "Start",
    "StepKind",
    "attempts_tool",
    "body_of",
    "is_decided",
    "is_expanded",
    "runs_items",
    "runs_plans",
    "step_kind",
    "tool_of",
]
