"""Restore: a resumed run takes its recorded state."""

from __future__ import annotations

import logging
from typing import TypeVar

from stratagem.planning._engine._gates import _Gates
from stratagem.planning._engine._observe import _resume_links
from stratagem.planning._engine._types import PlanResult
from stratagem.planning._errors import StepFailure
from stratagem.planning._plan import FailureClass, Plan, Step, StepStatus
from stratagem.planning._store import (
    CompensationStatus,
    GateDecision,
    GateKind,
    PlanState,
    StepResult,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _Restore(_Gates[P]):
    def restore(self, state: PlanState) -> None:
        """Take the recorded state: what is done stays done, what was in flight is reconciled."""
        plan = self.plan
        self.restored = True
        self.links = _resume_links(state.trace_contexts)
        admission = self.admission
        admission.started_at = state.started_at
        admission.spent_calls = state.spent_calls
        admission.spent_cost = state.spent_cost
        stopping = state.cancel_requested or any(
            s.status is StepStatus.FAILED for s in state.steps.values()
        )
        self.recorded_gates = {
            g.gate_id for g in state.gates.values() if g.decision is GateDecision.OPEN
        }
        if state.cancel_requested:
            self.cancelled = True
            self.stop_reason = "the plan was cancelled"
        for step in plan.steps:
            recorded = state.steps.get(step.id)
            if recorded is None:
                continue
            step_id = step.id
            self.attempts[step_id] = recorded.attempt
            match recorded.status:
                case StepStatus.SUCCEEDED:
                    self.outputs[step_id] = recorded.output
                    self.statuses[step_id] = StepStatus.SUCCEEDED
                    for dependent in self.dependents[step_id]:  # ready is computed below
                        self.waiting[dependent] -= 1
                case StepStatus.FAILED:
                    self.statuses[step_id] = StepStatus.FAILED
                    self.failures.append(
                        StepFailure(
                            step_id,
                            recorded.failure_class or FailureClass.LOGIC,
                            recorded.message,
                            recorded.attempt,
                        )
                    )
                    if not self.stop_reason:
                        self.stop_reason = f"the plan stopped after step {step_id!r} failed"
                case StepStatus.CANCELLED:
                    self.statuses[step_id] = StepStatus.CANCELLED
                case StepStatus.RETRYING:  # its last attempt failed and was to be retried
                    self.next_attempt[step_id] = recorded.attempt + 1
                case StepStatus.BLOCKED:  # held at a policy gate
                    self._restore_policy_gate(step, recorded.attempt, recorded.message, state)
                case StepStatus.RUNNING:
                    self._restore_in_flight(step, recorded.attempt, state, stopping)
                case _:
                    pass
        for gate in state.gates.values():
            if (
                gate.kind is GateKind.GATE
                and gate.decision is not GateDecision.OPEN
                and self.statuses.get(gate.gate_id) is StepStatus.PENDING
            ):
                self.decisions[gate.gate_id] = gate
        for entry in state.compensations:
            if self.statuses.get(entry.step_id) is not StepStatus.SUCCEEDED:
                continue
            self.compensable.append(entry.step_id)
            self.compensation[entry.step_id] = entry.status
            self.compensation_attempts[entry.step_id] = entry.attempt
            if entry.status is CompensationStatus.COMPENSATED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATED
            elif entry.status is CompensationStatus.FAILED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATION_FAILED
        self.ready.extend(
            step.id
            for step in plan.steps
            if self.statuses[step.id] is StepStatus.PENDING and self.waiting[step.id] == 0
        )

    def _restore_policy_gate(
        self, step: Step, attempt: int, message: str, state: PlanState
    ) -> None:
        gate = state.gates.get(step.id)
        if gate is not None and gate.decision is not GateDecision.OPEN:
            approve = gate.decision is GateDecision.APPROVED
            self._decide(
                step.id, GateKind.POLICY, approve, gate.approver, gate.rationale, gate.output
            )
            return
        self.gates[step.id] = GateKind.POLICY
        self.statuses[step.id] = StepStatus.BLOCKED
        self.gate_prompts[step.id] = gate.prompt if gate is not None else message
        self.new_gates.append(step.id)

    def _restore_in_flight(
        self, step: Step, attempt: int, state: PlanState, stopping: bool
    ) -> None:
        """A step was in flight when the plan stopped: re-run, reconcile, or mark it cancelled."""
        plan, step_id = self.plan, step.id
        if stopping:
            # The plan is ending anyway: the step is not re-run; its effect, if any, is not
            # compensated (only recorded successes are).
            self.statuses[step_id] = StepStatus.CANCELLED
            self._record(
                StepResult(
                    plan.id,
                    plan.revision,
                    step_id,
                    attempt,
                    StepStatus.CANCELLED,
                    failure_class=FailureClass.CANCELLED,
                    message="in flight when the plan stopped; not re-run as the plan is ending",
                )
            )
            return
        if self._is_idempotent(step):
            logger.info("plan %s: re-running idempotent in-flight step %s", plan.id, step_id)
            self.next_attempt[step_id] = attempt + 1
            return
        gate = state.gates.get(step_id)
        if gate is None or gate.decision is GateDecision.OPEN:
            self.gates[step_id] = GateKind.RECONCILE
            self.statuses[step_id] = StepStatus.BLOCKED
            self.new_gates.append(step_id)
            return
        approve = gate.decision is GateDecision.APPROVED
        self._decide(
            step_id, GateKind.RECONCILE, approve, gate.approver, gate.rationale, gate.output
        )

    def recorded_result(self, state: PlanState) -> PlanResult[P]:
        """The result of a finished plan, from its journal (nothing runs)."""
        for step_id, recorded in state.steps.items():
            if step_id not in self.statuses:
                continue
            self.statuses[step_id] = recorded.status
            if recorded.status is StepStatus.SUCCEEDED:
                self.outputs[step_id] = recorded.output
            elif recorded.status is StepStatus.FAILED:
                self.failures.append(
                    StepFailure(
                        step_id,
                        recorded.failure_class or FailureClass.LOGIC,
                        recorded.message,
                        recorded.attempt,
                    )
                )
        for entry in state.compensations:
            if entry.status is CompensationStatus.COMPENSATED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATED
            elif entry.status is CompensationStatus.FAILED:
                self.statuses[entry.step_id] = StepStatus.COMPENSATION_FAILED
        for step_id, status in self.statuses.items():
            if status is StepStatus.PENDING:
                self.statuses[step_id] = StepStatus.SKIPPED
        self._emit("", state.status, 0, message=state.message)
        return self._result(state.status, 0.0)
