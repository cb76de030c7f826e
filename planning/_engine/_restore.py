"""Restore: a resumed run takes its recorded state; a finished plan's result is read back."""

from __future__ import annotations

import logging
from typing import Any, Generic, TypeVar

from stratagem.planning._engine._conditions import _Conditions
from stratagem.planning._engine._gates import _Gates
from stratagem.planning._engine._policy import _Admission, step_is_idempotent
from stratagem.planning._engine._state import _RunState
from stratagem.planning._engine._types import PlanResult, ToolRunner
from stratagem.planning._errors import StepFailure
from stratagem.planning._plan import FailureClass, Plan, Step, StepStatus
from stratagem.planning._store import (
    CompensationStatus,
    GateDecision,
    GateKind,
    PlanState,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _Restore(Generic[P]):
    """Reads a plan's journal (folded into a ``PlanState``) into a new run, through the state's
    ``load_*`` transitions and the gates."""

    def __init__(
        self,
        state: _RunState[P],
        gates: _Gates,
        conditions: _Conditions,
        admission: _Admission,
        tools: ToolRunner,
    ) -> None:
        self.state = state
        self.gates = gates
        self.conditions = conditions
        self.admission = admission
        self.tools = tools

    def restore(self, recorded: PlanState) -> None:
        """Take the recorded state: what is done stays done, what was in flight is reconciled."""
        state, gates = self.state, self.gates
        self.admission.resume(recorded.started_at, recorded.spent_calls, recorded.spent_cost)
        stopping = recorded.cancel_requested or any(
            entry.status is StepStatus.FAILED and state.stops_on(step_id)
            for step_id, entry in recorded.steps.items()
        )
        gates.recorded = {
            g.gate_id for g in recorded.gates.values() if g.decision is GateDecision.OPEN
        }
        if recorded.cancel_requested:
            state.load_cancel_request()
        for step in state.plan.steps:
            entry = recorded.steps.get(step.id)
            if entry is None:
                continue
            step_id, attempt = step.id, entry.attempt
            gates.found_started(step_id)
            match entry.status:
                case StepStatus.SUCCEEDED:
                    state.load_succeeded(step_id, entry.output, attempt)
                case StepStatus.FAILED:
                    state.load_failed(
                        StepFailure(
                            step_id,
                            entry.failure_class or FailureClass.LOGIC,
                            entry.message,
                            attempt,
                        )
                    )
                case StepStatus.CANCELLED:
                    state.load_attempt(step_id, attempt, StepStatus.CANCELLED)
                case StepStatus.SKIPPED:  # its condition was false, or what it needs failed
                    state.load_skipped(step_id)
                case StepStatus.RETRYING:  # its last attempt failed and was to be retried
                    state.load_attempt(step_id, attempt)
                    state.load_resumed_mid_way(step_id, attempt + 1)
                case StepStatus.BLOCKED:  # held at a policy gate
                    state.load_attempt(step_id, attempt)
                    self._policy_gate(step, entry.message, recorded)
                case StepStatus.RUNNING:
                    state.load_attempt(step_id, attempt)
                    self._in_flight(step, attempt, recorded, stopping)
                case _:
                    state.load_attempt(step_id, attempt)
        for gate in recorded.gates.values():
            if gate.kind is GateKind.TOOL:
                gates.found_tool(gate)
            elif (
                gate.kind is not GateKind.GATE
                or state.statuses.get(gate.gate_id) is not StepStatus.PENDING
            ):
                continue
            elif gate.decision is GateDecision.OPEN:
                gates.found_waiting(gate)  # opened again when reached, as it was recorded
            else:
                gates.found_decided(gate)
        for compensation in recorded.compensations:
            if state.statuses.get(compensation.step_id) is StepStatus.SUCCEEDED:
                state.load_compensation(compensation)
        for condition in recorded.conditions.values():
            if state.statuses.get(condition.step_id) is StepStatus.PENDING:
                self.conditions.found(condition)
        state.load_ready()

    def _policy_gate(self, step: Step, message: str, recorded: PlanState) -> None:
        gate = recorded.gates.get(step.id)
        if gate is not None and gate.decision is not GateDecision.OPEN:
            self.gates.decide_recorded(gate, GateKind.POLICY)
            return
        self.gates.found_policy_prompt(step.id, gate.prompt if gate is not None else message)
        self.gates.found_open(step.id, GateKind.POLICY, gate)

    def _in_flight(self, step: Step, attempt: int, recorded: PlanState, stopping: bool) -> None:
        """A step was in flight when the plan stopped: re-run, reconcile, or mark it cancelled."""
        state, step_id = self.state, step.id
        if stopping:
            # The plan is ending anyway: the step is not re-run; its effect, if any, is not
            # compensated (only recorded successes are).
            state.load_cancelled_in_flight(
                step_id,
                attempt,
                "in flight when the plan stopped; not re-run as the plan is ending",
            )
            return
        if step_is_idempotent(step, self.tools):
            logger.info("plan %s: re-running idempotent in-flight step %s", state.plan.id, step_id)
            state.load_resumed_mid_way(step_id, attempt + 1)
            return
        gate = recorded.gates.get(step_id)
        if gate is not None and gate.kind is not GateKind.RECONCILE:
            gate = None  # the step's tool gate, decided before it ran: not this gate
        if gate is None or gate.decision is GateDecision.OPEN:
            self.gates.found_open(step_id, GateKind.RECONCILE, gate)
            return
        self.gates.decide_recorded(gate, GateKind.RECONCILE)

    def recorded_result(self, recorded: PlanState) -> PlanResult[P]:
        """The result of a finished plan, from its journal (nothing runs)."""
        statuses: dict[str, StepStatus] = {}
        outputs: dict[str, Any] = {}
        failures: list[StepFailure] = []
        for step_id, entry in recorded.steps.items():
            statuses[step_id] = entry.status
            if entry.status is StepStatus.SUCCEEDED:
                outputs[step_id] = entry.output
            elif entry.status is StepStatus.FAILED:
                failures.append(
                    StepFailure(
                        step_id,
                        entry.failure_class or FailureClass.LOGIC,
                        entry.message,
                        entry.attempt,
                    )
                )
        for compensation in recorded.compensations:
            if compensation.status is CompensationStatus.COMPENSATED:
                statuses[compensation.step_id] = StepStatus.COMPENSATED
            elif compensation.status is CompensationStatus.FAILED:
                statuses[compensation.step_id] = StepStatus.COMPENSATION_FAILED
        self.state.load_finished(statuses, outputs, failures)
        self.state.plan_event(recorded.status, recorded.message)
        return self.state.result(recorded.status, 0.0)
