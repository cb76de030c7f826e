"""The orchestrator's plan type: cross-agent steps and who is assigned to each (its own module so
that the goal planner, ``_goals``, builds these plans without importing the orchestrator)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from stratagem.planning import Plan

__all__ = ["Assignment", "OrchestrationPlan"]


class Assignment(BaseModel):
    """Which agent does what, in which step.

    Attributes:
        step: The plan step.
        agent: The role that does it.
        capability: The capability asked for.
        purpose: Why.
        score: How well the goal's clause matched the capability's intents, 0-1 (a goal in plain
            words, ``AskGoal``; ``None`` otherwise).
        dropped: Why a later revision dropped the step ("" while it is in the plan).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    agent: str
    capability: str
    purpose: str = ""
    score: float | None = None
    dropped: str = ""


class OrchestrationPlan(Plan):
    """An orchestration plan: cross-agent steps and who is assigned to each.

    Attributes:
        assignments: One per step, in plan order.
    """

    # What the planner decided, for the record: nothing runs these in a user's plan.
    planner_fields: ClassVar[frozenset[str]] = frozenset({"assignments"})

    assignments: list[Assignment] = Field(default_factory=list)
