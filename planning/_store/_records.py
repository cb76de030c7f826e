"""The journal's records: what a store appends, one small delta per change of a plan's state.

Records (all frozen dataclasses; ``Record`` is their union):

- ``PlanStatusRecord``: the plan's status changed (``running``, ``blocked``, ``paused``,
  ``compensating``, a final status).
- ``StepIntent``: an attempt of a step is about to start (its idempotency key is
  ``f"{plan_id}@{revision}:{step_id}"``). Written and committed *before* the tool call or dispatch.
- ``StepResult``: an attempt ended: ``succeeded`` (output JSON), ``retrying`` (a retried failure),
  or the step's final ``failed``/``cancelled`` (failure class + message).
- ``GateRecord``: a gate opened (a gate step, or a reconcile gate naming a step that was in flight
  when the plan stopped), or was approved or rejected (approver, rationale, revision).
- ``CompensationRecord``: the compensation journal: ``needed`` (committed with the step's success),
  ``running`` (an attempt's intent), ``compensated`` or ``failed``.
- ``ControlRecord``: a ``cancel`` was requested (so a resume honours it).
- ``ConditionRecord``: a step's condition (``when``) was evaluated.
- ``MapRecord``: a map step's list was evaluated (how many items, and its digest); each item's
  attempts are ``StepIntent``/``StepResult`` records under the key ``f"{step_id}.{index}"``.
- ``IterationRecord``: an iteration of a loop (or a sub-plan's one run) started or ended; the
  nested plan keeps its own journal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._plan import FailureClass, PlanStatus, StepStatus


class GateKind(StrEnum):
    """What a gate is for."""

    GATE = "gate"
    """A gate step of the plan."""
    RECONCILE = "reconcile"
    """A step was in flight when the plan stopped and its tool is not idempotent."""
    POLICY = "policy"
    """A step with ``on_policy_failure="gate"`` failed a policy check."""
    TOOL = "tool"
    """The policy asks for an approval before this tool step calls its tool."""


class GateDecision(StrEnum):
    """Where a gate is."""

    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"


class CompensationStatus(StrEnum):
    """Where one step's compensation is."""

    NEEDED = "needed"
    RUNNING = "running"
    COMPENSATED = "compensated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class PlanStatusRecord:
    """The plan's status changed.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        status: The new status.
        message: Why, in one line ("" when there is nothing to add).
        at: Wall-clock time (``time.time()``).
        trace_context: For ``running``: the W3C ``traceparent`` of the run's plan span ("" when
            the run was not traced), so a resumed run can link to the run it continues.
    """

    plan_id: str
    revision: int
    status: PlanStatus
    message: str = ""
    at: float = field(default_factory=time.time)
    trace_context: str = ""


@dataclass(frozen=True, slots=True)
class StepIntent:
    """An attempt of a step is about to start; committed before its side effect.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The step.
        attempt: The attempt number, from 1.
        cost: The cost units reserved for the attempt, for a plan with a budget (``None``
            otherwise). Every intent reserves one tool call.
        at: Wall-clock time (``time.time()``); 0 in records stored before it was kept.
    """

    plan_id: str
    revision: int
    step_id: str
    attempt: int
    cost: float | None = None
    at: float = field(default_factory=time.time, compare=False)

    @property
    def key(self) -> str:
        """The step's idempotency key, ``f"{plan_id}@{revision}:{step_id}"``."""
        return step_run_id(self.plan_id, self.revision, self.step_id)


@dataclass(frozen=True, slots=True)
class StepResult:
    """An attempt of a step ended.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The step.
        attempt: The attempt that ended.
        status: ``succeeded``, ``retrying`` (this attempt failed and another follows), ``failed``
            or ``cancelled`` (final).
        output_json: The output as JSON, for ``succeeded``.
        failure_class: The failure's class, for the other statuses.
        message: A one-line description of the failure.
        at: Wall-clock time (``time.time()``); 0 in records stored before it was kept.
    """

    plan_id: str
    revision: int
    step_id: str
    attempt: int
    status: StepStatus
    output_json: str | None = None
    failure_class: FailureClass | None = None
    message: str = ""
    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True, slots=True)
class GateRecord:
    """A gate opened (or escalated: opened again for others to decide) or was decided.

    Attributes:
        plan_id: The plan.
        revision: The revision the gate belongs to (a decision: the one it was given for).
        gate_id: A gate step's id, or the id of the step a reconcile, policy or tool gate names.
        decision: ``open``, ``approved`` or ``rejected``.
        kind: A gate step, or a reconcile, policy or tool gate.
        prompt: What the approver is asked (on ``open``).
        approver: Who decided (``TIMEOUT_APPROVER`` when the gate's deadline decided).
        rationale: Why.
        output_json: For an approved reconcile gate: the output to record for the step instead of
            re-running it (``None``: re-run it).
        at: Wall-clock time (``time.time()``).
        value_json: For an approval of a gate that asks: the value, as JSON.
        arguments_json: For a tool gate: on ``open``, the arguments the tool would be called
            with; on an approval, the arguments as the approver edited them (``None``: as
            they were).
        deadline: On ``open``: when the gate times out (``time.time()`` scale; ``None``: never).
        escalate_at: On ``open``: when it escalates (``None``: never, or it has escalated).
        deciders: On ``open``: who may decide (empty: whoever the policy allows).
        escalated: On ``open``: this opening hands the gate to others (``deciders``).
    """

    plan_id: str
    revision: int
    gate_id: str
    decision: GateDecision
    kind: GateKind = GateKind.GATE
    prompt: str = ""
    approver: str = ""
    rationale: str = ""
    output_json: str | None = None
    at: float = field(default_factory=time.time)
    value_json: str | None = None
    arguments_json: str | None = None
    deadline: float | None = None
    escalate_at: float | None = None
    deciders: tuple[str, ...] = ()
    escalated: bool = False


@dataclass(frozen=True, slots=True)
class CompensationRecord:
    """An entry of the compensation journal.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The compensated step.
        status: ``needed`` (written with the step's success), ``running`` (an attempt's intent),
            ``compensated`` or ``failed``.
        attempt: The compensation attempt (0 for ``needed``).
        message: Why it failed, for ``failed``.
    """

    plan_id: str
    revision: int
    step_id: str
    status: CompensationStatus
    attempt: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A control request that a later resume must honour.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        action: ``cancel``.
        at: Wall-clock time (``time.time()``).
    """

    plan_id: str
    revision: int
    action: Literal["cancel"] = "cancel"
    at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """What earlier revisions of the plan spent, carried into a new revision's budget account.

    A budget belongs to the plan, not to one revision: without this record a replan would start
    spending from zero again.

    Attributes:
        plan_id: The plan.
        revision: The new revision.
        calls: Tool calls reserved by earlier revisions.
        cost: Cost units reserved by earlier revisions.
    """

    plan_id: str
    revision: int
    calls: int
    cost: float


@dataclass(frozen=True, slots=True)
class ConditionRecord:
    """A step's condition (``when``), evaluated: whether it held and its value.

    Journaled before the step starts or is skipped, so a resumed run and a replay take the
    decision from the journal rather than evaluating it again.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The step.
        holds: Whether the step runs.
        value_json: The condition's value, as JSON.
    """

    plan_id: str
    revision: int
    step_id: str
    holds: bool
    value_json: str = "null"


@dataclass(frozen=True, slots=True)
class MapRecord:
    """A map step's list, evaluated when the step starts: journaled before any item starts, so a
    resumed run checks that it maps the same list and a replay compares the expansion.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The map step.
        items: How many items the list has.
        digest: sha256 of the list's canonical JSON (16 hex digits).
    """

    plan_id: str
    revision: int
    step_id: str
    items: int
    digest: str


IterationOutcome = Literal["started", "held", "not_held", "failed"]
"""Where an iteration is: ``started``, or ended with its loop's ``until`` holding (``held``), not
holding (``not_held``), or with its nested plan failed (``failed``)."""


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """An iteration of a loop step (or the one run of a sub-plan step) started or ended.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The loop (or sub-plan) step.
        iteration: The iteration, from 1.
        outcome: ``started``, ``held``, ``not_held`` or ``failed``.
        value_json: For an ended loop iteration: the value of ``until``, as JSON.
        at: Wall-clock time (``time.time()``); a loop's timebox counts from its first start.
    """

    plan_id: str
    revision: int
    step_id: str
    iteration: int
    outcome: IterationOutcome
    value_json: str = "null"
    at: float = field(default_factory=time.time)


Record = (
    PlanStatusRecord
    | StepIntent
    | StepResult
    | GateRecord
    | CompensationRecord
    | ControlRecord
    | BudgetRecord
    | ConditionRecord
    | MapRecord
    | IterationRecord
)
"""Any journal record."""
