"""``AskGoal``: a goal in plain words, for any deployment (the orchestrator plans it).

The orchestrator routes the goal over the capability directory (every capability with intents,
``protocol._intents``), plans one cross-agent step per clause, runs the plan and answers with a
summary of what was done and what was not, each step's output under it. The capability travels in
the envelope's ``extension`` body (its JSON), as an extension's does.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints, field_validator

from stratagem.protocol._capabilities import (
    CAPABILITIES,
    EXTENSION_FIELD,
    CapabilitySpec,
    NewPlanId,
    WireModel,
)

__all__ = [
    "ASK_GOAL",
    "MAX_GOAL_CHARS",
    "AskGoalRequest",
    "AskGoalResponse",
    "GoalBudget",
    "GoalStatus",
    "GoalStep",
]

MAX_GOAL_CHARS: Final = 2000
"""The longest goal in plain words."""

Scalar = str | int | float | bool
InputName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,63}$")]
DoneName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,139}$")]
MAX_GOAL_SECONDS: Final = 7 * 86400.0


class GoalBudget(WireModel):
    """What a goal's plan may spend (the engine's ``Budget``; each limit optional).

    Attributes:
        wall_time_s: Seconds from the plan's first start; checked before each step starts.
        tool_calls: Attempts dispatched (each cross-agent request, each retry).
        cost_units: The sum of the attempts' costs (a cross-agent attempt costs 1).
    """

    wall_time_s: float | None = Field(default=None, gt=0.0, le=MAX_GOAL_SECONDS)
    tool_calls: int | None = Field(default=None, ge=1, le=1_000_000)
    cost_units: float | None = Field(default=None, gt=0.0, le=1e9)


class AskGoalRequest(WireModel):
    """A goal in plain words: ``check the weather in Seattle and set a timer for 10 minutes``.

    Attributes:
        goal: What to do, 1-2000 characters (not only spaces).
        inputs: Slot values given apart from the text, by slot name (a clause that leaves a slot
            empty takes it from here).
        plan_only: Plan, answer with the plan, run nothing.
        approve: Wait at a gate for approval before the steps that have side effects.
        plan_id: The orchestrator's plan id (default: ``ask-<12 hex>``).
        detach: Answer once the plan runs (its ``plan_id`` and ``status``), the goal running on
            bound by no caller's deadline (``stratagem ask --approve`` does: the goal then waits
            for the approval, not the command).
        deadline_s: The goal's own time limit in seconds, whoever waits for it: no step starts
            after it (the plan's wall-time budget), and a restarted orchestrator cancels the goal
            rather than resume it past it (the plan's deadline).
        budget: What its plan may spend (the engine's budget); a step whose attempt would pass it
            does not start, and the goal fails (no revision refills a budget).
        done_when: The definition of done: steps of the plan (a step id, a capability
            ``SetTimer`` or ``timer.SetTimer``) that must succeed for the goal to be done; one
            that names no planned step is refused. The answer's ``done`` says whether they did.
    """

    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS)
    inputs: dict[InputName, Scalar] = Field(default_factory=dict, max_length=64)
    plan_only: bool = False
    approve: bool = False
    plan_id: NewPlanId = ""
    detach: bool = False
    deadline_s: float | None = Field(default=None, gt=0.0, le=MAX_GOAL_SECONDS)
    budget: GoalBudget | None = None
    done_when: list[DoneName] = Field(default_factory=list, max_length=16)

    @field_validator("goal")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the goal is empty: say what to do, e.g. 'set a timer for 5 minutes'")
        return value


GoalStatus = Literal["planned", "succeeded", "partial", "failed"]
"""``planned`` (``plan_only``), ``succeeded`` (every step done), ``partial`` (a step failed and what
depended on it was dropped; the rest done), ``failed``."""


class GoalStep(WireModel):
    """One step of a goal's plan: who does what, why, and what came of it.

    Attributes:
        id: The step's id in the orchestrator's plan.
        agent: The agent (role) that serves it.
        capability: The capability asked for.
        request_json: The request, as JSON (an earlier step's output is ``{"$ref": ...}``).
        depends_on: The steps it waits for.
        why: Which clause of the goal it serves and which intent matched.
        score: The match score, 0-1.
        side_effects: Whether the capability changes something.
        status: ``planned``, ``succeeded``, ``failed``, ``dropped`` (it depended on a failed
            step), ``skipped`` or ``pending``.
        output_json: Its output, as JSON ("" when none).
        error: Why it failed or was dropped ("" otherwise).
    """

    id: str = Field(max_length=64)
    agent: str = Field(max_length=64)
    capability: str = Field(max_length=64)
    request_json: str = Field(default="", max_length=1 << 20)
    depends_on: list[str] = Field(default_factory=list, max_length=64)
    why: str = Field(default="", max_length=500)
    score: float = Field(default=0.0, ge=0.0, le=1.0)
    side_effects: bool = False
    status: str = Field(default="planned", max_length=32)
    output_json: str = Field(default="", max_length=1 << 20)
    error: str = Field(default="", max_length=2000)


class AskGoalResponse(WireModel):
    """A goal's answer: its plan's id and status, a summary, and each step.

    Attributes:
        plan_id: The orchestrator's plan.
        status: See ``GoalStatus``.
        route: ``single`` (one capability answered it) or ``plan`` (several steps).
        summary: What was done and what was not, in a few lines.
        steps: Every step planned, in plan order.
        revisions: How many revisions the plan had (more than 1: it was replanned).
        done: Whether the request's definition of done (``done_when``) holds: every step it
            names succeeded (``None``: the request gave none, or nothing ran).
    """

    plan_id: str = Field(max_length=200)
    status: str = Field(max_length=32)
    route: str = Field(default="", max_length=16)
    summary: str = Field(default="", max_length=8000)
    steps: list[GoalStep] = Field(default_factory=list, max_length=64)
    revisions: int = Field(default=1, ge=0)
    done: bool | None = None


ASK_GOAL: Final = CapabilitySpec(
    name="AskGoal",
    role="orchestrator",
    field=EXTENSION_FIELD,
    request=AskGoalRequest,
    response=AskGoalResponse,
)
CAPABILITIES[ASK_GOAL.name] = ASK_GOAL
