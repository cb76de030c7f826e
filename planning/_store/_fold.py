"""A plan's state as the fold of its journal: ``fold`` and what it gives (``PlanState``).

The state of a plan is never stored whole: it is its revision's JSON and the fold of its journal's
records (``_records``), in order, so the store grows linearly with the number of steps run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from stratagem.planning._errors import StoreError
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, StepStatus
from stratagem.planning._store._records import (
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    ConditionRecord,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    IterationRecord,
    MapRecord,
    PlanStatusRecord,
    Record,
    StepIntent,
    StepResult,
)

P = TypeVar("P", bound=Plan)


@dataclass(slots=True)
class StepState:
    """A step's last recorded state.

    Attributes:
        status: ``running`` when an intent has no result yet (the step was in flight), otherwise
            the last result's status.
        attempt: The last attempt recorded.
        output: The output, when the step succeeded.
        failure_class: The last failure's class.
        message: The last failure's message.
        started: When its first attempt started (``None``: unknown, or it never ran).
        ended: When its last recorded attempt ended (``None``: unknown, or not ended).
    """

    status: StepStatus
    attempt: int
    output: dict[str, Any] | None = None
    failure_class: FailureClass | None = None
    message: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def in_flight(self) -> bool:
        """Whether an attempt started and has no recorded result."""
        return self.status is StepStatus.RUNNING


TIMEOUT_APPROVER: Final = "(timeout)"
"""The approver of a decision a gate's deadline made (no identity has this form)."""


@dataclass(slots=True)
class GateState:
    """A gate's recorded state.

    Attributes:
        gate_id: The gate's id.
        kind: A gate step, or a reconcile, policy or tool gate.
        decision: ``open``, ``approved`` or ``rejected``.
        revision: The revision it was opened (or decided) for.
        prompt: What the approver is asked.
        approver: Who decided (``TIMEOUT_APPROVER``: its deadline did).
        rationale: Why.
        output: For an approved reconcile gate: the output to record instead of re-running.
        value: For an approval of a gate that asks: the value (``has_value`` says whether one
            was given: ``None`` may be one).
        has_value: Whether the decision carried a value.
        arguments: For a tool gate: the arguments shown at its opening, then as approved (an
            approver's edit) .
        edited: Whether the approval edited the tool's arguments.
        deadline: When it times out (``None``: never).
        escalate_at: When it escalates (``None``: never, or it has).
        deciders: Who may decide (empty: whoever the policy allows).
        escalated: Whether it was handed to others.
        opened_at: When it (last) opened.
    """

    gate_id: str
    kind: GateKind
    decision: GateDecision
    revision: int
    prompt: str = ""
    approver: str = ""
    rationale: str = ""
    output: dict[str, Any] | None = None
    value: Any = None
    has_value: bool = False
    arguments: dict[str, Any] | None = None
    edited: bool = False
    deadline: float | None = None
    escalate_at: float | None = None
    deciders: tuple[str, ...] = ()
    escalated: bool = False
    opened_at: float | None = None

    @property
    def timed_out(self) -> bool:
        """Whether its deadline decided it."""
        return self.approver == TIMEOUT_APPROVER


@dataclass(slots=True)
class CompensationState:
    """One step's compensation, as the journal has it.

    Attributes:
        step_id: The compensated step.
        status: Where it is.
        attempt: The last attempt (0 before the first).
        message: Why it failed.
    """

    step_id: str
    status: CompensationStatus
    attempt: int = 0
    message: str = ""


@dataclass(slots=True)
class PlanState:
    """A plan revision's state, rebuilt from its journal.

    Attributes:
        plan_id: The plan.
        revision: The revision (the newest stored).
        plan_json: The plan as written by ``StateStore.save_plan``.
        status: The last recorded plan status (``pending`` before the first).
        message: The last status record's message.
        steps: Step id -> last recorded state, for steps with any record (a map's items under
            ``f"{step_id}.{index}"``).
        gates: Gate id -> state.
        compensations: The compensation journal, in the order the steps succeeded.
        cancel_requested: Whether a ``cancel`` was recorded.
        records: How many journal records were folded.
        started_at: When the revision first ran (the first ``running`` status), or ``None``.
        spent_calls: Tool calls reserved so far (one per intent).
        spent_cost: Cost units reserved so far.
        trace_contexts: The W3C ``traceparent`` of each traced run of the revision, oldest first
            (the first is the original run's; a resumed run links to it and to the last).
        conditions: Step id -> its evaluated condition, for the steps whose ``when`` was decided.
        maps: Map step id -> its evaluated list (``MapRecord``).
        iterations: Loop (or sub-plan) step id -> its iteration records, in order.
    """

    plan_id: str
    revision: int
    plan_json: str
    status: PlanStatus = PlanStatus.PENDING
    message: str = ""
    steps: dict[str, StepState] = field(default_factory=dict)
    gates: dict[str, GateState] = field(default_factory=dict)
    compensations: list[CompensationState] = field(default_factory=list)
    cancel_requested: bool = False
    records: int = 0
    started_at: float | None = None
    spent_calls: int = 0
    spent_cost: float = 0.0
    trace_contexts: list[str] = field(default_factory=list)
    conditions: dict[str, ConditionRecord] = field(default_factory=dict)
    maps: dict[str, MapRecord] = field(default_factory=dict)
    iterations: dict[str, list[IterationRecord]] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, Any]:
        """Step id -> output, for every step recorded as succeeded."""
        return {
            step_id: state.output
            for step_id, state in self.steps.items()
            if state.status is StepStatus.SUCCEEDED and "." not in step_id  # not a map's item
        }

    def plan(self, plan_type: type[P]) -> P:
        """The stored plan as ``plan_type``; fields ``plan_type`` lacks are dropped.

        Args:
            plan_type: ``Plan`` or a subclass of it (a role's plan type).
        """
        data = json.loads(self.plan_json)
        known = plan_type.model_fields
        return plan_type.model_validate({k: v for k, v in data.items() if k in known})


def fold(plan_id: str, revision: int, plan_json: str, records: Iterable[Record]) -> PlanState:
    """Rebuild a revision's state from its journal, applying the records in order.

    Records of other plans or revisions are ignored.

    Args:
        plan_id: The plan.
        revision: The revision.
        plan_json: The revision's plan JSON.
        records: The journal, oldest first.
    """
    state = PlanState(plan_id, revision, plan_json)
    compensations: dict[str, CompensationState] = {}
    for record in records:
        if record.plan_id != plan_id or record.revision != revision:
            continue
        state.records += 1
        match record:
            case PlanStatusRecord():
                state.status = record.status
                state.message = record.message
                if state.started_at is None and record.status is PlanStatus.RUNNING:
                    state.started_at = record.at
                if record.trace_context and record.trace_context not in state.trace_contexts:
                    state.trace_contexts.append(record.trace_context)
            case StepIntent():
                earlier = state.steps.get(record.step_id)
                started = earlier.started if earlier is not None else None
                if started is None and record.at:
                    started = record.at
                state.steps[record.step_id] = StepState(
                    StepStatus.RUNNING, record.attempt, started=started
                )
                state.spent_calls += 1
                if record.cost is not None:
                    state.spent_cost += record.cost
            case BudgetRecord():
                state.spent_calls += record.calls
                state.spent_cost += record.cost
            case StepResult():
                output = None if record.output_json is None else json.loads(record.output_json)
                earlier = state.steps.get(record.step_id)
                state.steps[record.step_id] = StepState(
                    record.status,
                    record.attempt,
                    output,
                    record.failure_class,
                    record.message,
                    started=earlier.started if earlier is not None else None,
                    ended=record.at or None,
                )
            case GateRecord():
                state.gates[record.gate_id] = _gate_state(record, state.gates.get(record.gate_id))
            case CompensationRecord():
                entry = compensations.get(record.step_id)
                if entry is None:
                    entry = CompensationState(record.step_id, record.status)
                    compensations[record.step_id] = entry
                    state.compensations.append(entry)
                entry.status = record.status
                entry.attempt = max(entry.attempt, record.attempt)
                entry.message = record.message
            case ControlRecord():
                state.cancel_requested = True
            case ConditionRecord():
                state.conditions[record.step_id] = record
            case MapRecord():
                state.maps[record.step_id] = record
            case IterationRecord():
                state.iterations.setdefault(record.step_id, []).append(record)
            case _:  # pragma: no cover - the union is closed
                raise StoreError(f"unknown record {record!r}")
    return state


def _gate_state(record: GateRecord, previous: GateState | None) -> GateState:
    """A gate's state after ``record``: an opening says what the gate is (its deadline, who
    decides it); a decision keeps that and adds who decided, why and with what."""
    arguments = None if record.arguments_json is None else json.loads(record.arguments_json)
    state = GateState(
        gate_id=record.gate_id,
        kind=record.kind,
        decision=record.decision,
        revision=record.revision,
        prompt=record.prompt or (previous.prompt if previous else ""),
        approver=record.approver,
        rationale=record.rationale,
        output=None if record.output_json is None else json.loads(record.output_json),
        value=None if record.value_json is None else json.loads(record.value_json),
        has_value=record.value_json is not None,
        arguments=arguments,
        deadline=record.deadline,
        escalate_at=record.escalate_at,
        deciders=record.deciders,
        escalated=record.escalated,
        opened_at=record.at,
    )
    if record.decision is not GateDecision.OPEN and previous is not None:
        state.edited = arguments is not None
        if arguments is None:
            state.arguments = previous.arguments
        state.deadline = previous.deadline
        state.escalate_at = None
        state.deciders = previous.deciders
        state.escalated = previous.escalated
        state.opened_at = previous.opened_at
    return state
