"""Restore: a resumed run takes its recorded state; a finished plan's result is read back.

A map that had started finds its items' results (its done items are not run again; one in
flight whose tool is not idempotent holds the map at a reconcile gate named after it); a loop or a
sub-plan finds its iterations (the nested plans resume from their own journals).
"""

from __future__ import annotations

import logging
from typing import Any, Generic, TypeVar

from stratagem.planning._engine._attempts import _Outcome
from stratagem.planning._engine._conditions import _Conditions
from stratagem.planning._engine._gates import _Gates
from stratagem.planning._engine._map import _Maps
from stratagem.planning._engine._policy import _Admission, step_is_idempotent
from stratagem.planning._engine._state import (
    _loop as loop_ledger,
)
from stratagem.planning._engine._state import (
    _map as map_ledger,
)
from stratagem.planning._engine._state import (
    _resume as resume,
)
from stratagem.planning._engine._state import _RunState
from stratagem.planning._engine._types import PlanResult, ToolRunner
from stratagem.planning._errors import StepFailure
from stratagem.planning._kinds import runs_items, runs_plans
from stratagem.planning._plan import (
    FailureClass,
    MapStep,
    Plan,
    Step,
    StepStatus,
)
from stratagem.planning._store import (
    CompensationStatus,
    GateDecision,
    GateKind,
    PlanState,
    StepState,
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
        maps: _Maps,
        admission: _Admission,
        tools: ToolRunner,
    ) -> None:
        self.state = state
        self.gates = gates
        self.conditions = conditions
        self.maps = maps
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
            resume.load_cancel_request(state)
        items = _items_by_map(recorded)
        for step in state.plan.steps:
            entry = recorded.steps.get(step.id)
            if entry is None:
                if runs_items(step) and (step.id in recorded.maps or step.id in items):
                    self._map(step, recorded, items.get(step.id, {}), stopping)
                elif runs_plans(step):
                    for record in recorded.iterations.get(step.id, ()):
                        loop_ledger.load_iteration(state, record)
                continue
            step_id, attempt = step.id, entry.attempt
            gates.found_started(step_id)
            match entry.status:
                case StepStatus.SUCCEEDED:
                    resume.load_succeeded(state, step_id, entry.output, attempt)
                case StepStatus.FAILED:
                    resume.load_failed(
                        state,
                        StepFailure(
                            step_id,
                            entry.failure_class or FailureClass.LOGIC,
                            entry.message,
                            attempt,
                        ),
                    )
                case StepStatus.CANCELLED:
                    resume.load_attempt(state, step_id, attempt, StepStatus.CANCELLED)
                case StepStatus.SKIPPED:  # its condition was false, or what it needs failed
                    resume.load_skipped(state, step_id)
                case StepStatus.RETRYING:  # its last attempt failed and was to be retried
                    resume.load_attempt(state, step_id, attempt)
                    resume.load_resumed_mid_way(state, step_id, attempt + 1)
                    if runs_plans(step):  # it retries a nested plan
                        for record in recorded.iterations.get(step.id, ()):
                            loop_ledger.load_iteration(state, record)
                case StepStatus.BLOCKED:  # held at a policy gate
                    resume.load_attempt(state, step_id, attempt)
                    self._policy_gate(step, entry.message, recorded)
                case StepStatus.RUNNING:
                    resume.load_attempt(state, step_id, attempt)
                    self._in_flight(step, attempt, recorded, stopping)
                case _:
                    resume.load_attempt(state, step_id, attempt)
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
            status = state.statuses.get(compensation.step_id)
            if status is StepStatus.SUCCEEDED or (
                status is None and _expanded(compensation.step_id, recorded)
            ):
                resume.load_compensation(state, compensation)
                item = recorded.steps.get(compensation.step_id)
                if status is None and item is not None:  # a map's item: its output is undone
                    owner, _, index = compensation.step_id.partition(".")
                    map_ledger.load_item(state, owner, int(index), item.output, item.attempt)
        for condition in recorded.conditions.values():
            if state.statuses.get(condition.step_id) is StepStatus.PENDING:
                self.conditions.found(condition)
        resume.load_ready(state)

    def _map(
        self, step: MapStep, recorded: PlanState, items: dict[int, StepState], stopping: bool
    ) -> None:
        """A map that had started: its items' results; one in flight is re-run when its work is
        idempotent, or else holds the map at a reconcile gate (unless the plan is ending)."""
        state = self.state
        resume_at: dict[int, int] = {}
        in_flight: list[int] = []
        failed: tuple[int, _Outcome] | None = None
        for index in sorted(items):
            entry = items[index]
            match entry.status:
                case StepStatus.SUCCEEDED:
                    map_ledger.load_item(state, step.id, index, entry.output, entry.attempt)
                case StepStatus.FAILED:
                    map_ledger.load_item_attempt(state, step.id, index, entry.attempt)
                    if failed is None:
                        failure_class = entry.failure_class or FailureClass.LOGIC
                        outcome = _Outcome(None, failure_class, entry.message, entry.attempt)
                        failed = (index, outcome)
                case StepStatus.RUNNING:
                    map_ledger.load_item_attempt(state, step.id, index, entry.attempt)
                    in_flight.append(index)
                    resume_at[index] = entry.attempt + 1
                case _:  # retrying, or cancelled when another item failed or the plan stopped
                    map_ledger.load_item_attempt(state, step.id, index, entry.attempt)
                    resume_at[index] = entry.attempt + 1
        self.maps.found_map(
            step.id, recorded.maps.get(step.id), resume_at, failed, frozenset(in_flight)
        )
        if not in_flight or stopping or step_is_idempotent(step, self.tools):
            return
        resume.load_attempt(state, step.id, 0)
        gate = recorded.gates.get(step.id)
        if gate is not None and gate.kind is not GateKind.RECONCILE:
            gate = None
        if gate is not None and gate.decision is not GateDecision.OPEN:
            # Decided while no engine ran: items it says did happen are done, the rest re-run.
            approve = gate.decision is GateDecision.APPROVED
            if approve and gate.output is not None:
                self.maps.reconciled(step.id, gate.output)
            self.gates.decide(
                step.id, GateKind.RECONCILE, approve, gate.approver, gate.rationale, None
            )
            return
        keys = ", ".join(f"{step.id}.{index}" for index in in_flight[:5])
        more = f" (and {len(in_flight) - 5} more)" if len(in_flight) > 5 else ""
        prompt = (
            f"map {step.id!r} (tool {step.tool!r}) had item(s) {keys}{more} in flight when the "
            f"plan stopped; approve to run them again, or approve with the outputs of those "
            f'that did happen ({{"items": {{"INDEX": output}}}}); reject to fail the map'
        )
        self.gates.found_policy_prompt(step.id, prompt)  # the prompt of this gate, too
        self.gates.found_open(step.id, GateKind.RECONCILE, gate)

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
            resume.load_cancelled_in_flight(
                state,
                step_id,
                attempt,
                "in flight when the plan stopped; not re-run as the plan is ending",
            )
            return
        if step_is_idempotent(step, self.tools):
            logger.info("plan %s: re-running idempotent in-flight step %s", state.plan.id, step_id)
            resume.load_resumed_mid_way(state, step_id, attempt + 1)
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
        resume.load_finished(self.state, statuses, outputs, failures)
        self.state.plan_event(recorded.status, recorded.message)
        return self.state.result(recorded.status, 0.0)


def _items_by_map(recorded: PlanState) -> dict[str, dict[int, StepState]]:
    """The recorded states of map items, by map step id and item index."""
    found: dict[str, dict[int, StepState]] = {}
    for key, entry in recorded.steps.items():
        owner, dot, index = key.partition(".")
        if dot and index.isdigit():
            found.setdefault(owner, {})[int(index)] = entry
    return found


def _expanded(key: str, recorded: PlanState) -> bool:
    """Whether ``key`` (a compensation entry that is no step) is a map's succeeded item or a
    nested plan's iteration, which stay to be undone whatever their step's status."""
    entry = recorded.steps.get(key)
    return entry is None or entry.status is StepStatus.SUCCEEDED
