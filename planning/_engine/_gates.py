"""Gates: gate steps, reconcile and policy gates, their decisions; pause and cancel."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar, assert_never

from stratagem.planning._engine._state import _RunState
from stratagem.planning._errors import GateDecisionError
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    Plan,
    PlanStatus,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._store import (
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
    PlanStatusRecord,
    StepResult,
)

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


class _Gates(_RunState[P]):
    def _policy_gate(self, step: Step, attempts: int, message: str) -> None:
        """Hold the plan at a gate named after ``step``, which failed a policy check."""
        plan = self.plan
        self.attempts[step.id] = attempts
        self._record(
            StepResult(
                plan.id,
                plan.revision,
                step.id,
                attempts,
                StepStatus.BLOCKED,
                failure_class=FailureClass.POLICY,
                message=message,
            )
        )
        self.gates[step.id] = GateKind.POLICY
        self.gate_prompts[step.id] = (
            f"step {step.id!r} failed a policy check: {message}; approve to re-run it, "
            f"reject to fail it"
        )
        self._announce_gate(step.id)

    def _reach_gate(self, step: GateStep) -> None:
        decision = self.decisions.pop(step.id, None)
        if decision is not None:
            self._decide(
                step.id,
                GateKind.GATE,
                decision.decision is GateDecision.APPROVED,
                decision.approver,
                decision.rationale,
                None,
            )
            return
        self.gates[step.id] = GateKind.GATE
        self._announce_gate(step.id)

    def _announce_gate(self, gate_id: str) -> None:
        """Mark ``gate_id`` blocked (and the plan), emit the events, record the opening."""
        plan = self.plan
        kind = self.gates[gate_id]
        step = self.steps[gate_id]
        prompt = self.gate_prompts.get(gate_id) or (
            step.prompt if isinstance(step, GateStep) else _reconcile_prompt(step)
        )
        self.statuses[gate_id] = StepStatus.BLOCKED
        if gate_id not in self.recorded_gates:  # a resumed run finds some recorded already
            self.recorded_gates.add(gate_id)
            self._record(
                GateRecord(plan.id, plan.revision, gate_id, GateDecision.OPEN, kind, prompt=prompt)
            )
        self._emit(gate_id, StepStatus.BLOCKED, self.attempts.get(gate_id, 0), message=prompt)
        logger.info("plan %s@%d: gate %s is waiting: %s", plan.id, plan.revision, gate_id, prompt)
        if not self.blocked:
            self.blocked = True
            self._record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.BLOCKED, prompt))
            self._emit("", PlanStatus.BLOCKED, 0, message=prompt)

    def check_decision(
        self, gate_id: str, revision: int, output: dict[str, Any] | None
    ) -> GateKind:
        """The kind of gate a decision applies to; raises ``GateDecisionError`` when none."""
        plan = self.plan
        if revision != plan.revision:
            raise GateDecisionError(
                plan.id,
                gate_id,
                revision,
                f"plan {plan.id!r} is at revision {plan.revision}; a decision given for "
                f"revision {revision} does not apply to it",
            )
        kind = self.gates.get(gate_id)
        if kind is None:
            step = self.steps.get(gate_id)
            if not (
                isinstance(step, GateStep)
                and self.statuses[gate_id] is StepStatus.PENDING
                and gate_id not in self.decisions
            ):
                state = "unknown" if step is None else self.statuses[gate_id].value
                raise GateDecisionError(
                    plan.id,
                    gate_id,
                    revision,
                    f"plan {plan.id!r} has no open gate {gate_id!r} (the step is {state})",
                )
            kind = GateKind.GATE
        if output is not None and kind is GateKind.GATE:
            raise GateDecisionError(
                plan.id, gate_id, revision, "an output may only be given to a reconcile gate"
            )
        return kind

    def apply_decision(
        self,
        gate_id: str,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
    ) -> None:
        """Act on a recorded decision (``Engine.decide``)."""
        kind = self.gates.pop(gate_id, None)
        if kind is None:
            if isinstance(self.steps.get(gate_id), GateStep) and (
                self.statuses[gate_id] is StepStatus.PENDING
            ):  # decided before the gate was reached
                decision = GateDecision.APPROVED if approve else GateDecision.REJECTED
                self.decisions[gate_id] = GateState(
                    gate_id,
                    GateKind.GATE,
                    decision,
                    self.plan.revision,
                    approver=approver,
                    rationale=rationale,
                )
            else:
                logger.info("plan %s: gate %s closed before its decision", self.plan.id, gate_id)
            return
        try:
            self._decide(gate_id, kind, approve, approver, rationale, output)
            # The decision comes from the caller's task; the steps it releases belong under the
            # plan span, like those a completion starts.
            self.callback_context.run(self._start_ready)
        except Exception as exc:  # a bug here must not hang the run: hand it to run()
            if not self.finished.done():
                self.finished.set_exception(exc)
            return
        self._maybe_finish()

    def _decide(
        self,
        gate_id: str,
        kind: GateKind,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
    ) -> None:
        logger.info(
            "plan %s gate %s %s by %s: %s",
            self.plan.id,
            gate_id,
            "approved" if approve else "rejected",
            approver,
            rationale,
        )
        attempt = self.attempts.get(gate_id, 0)
        if self.tracing and self.span.is_recording():
            self.span.add_event(
                "gate.decided",
                {
                    "stratagem.step.id": gate_id,
                    "stratagem.gate.kind": kind.value,
                    "stratagem.gate.decision": "approved" if approve else "rejected",
                    "stratagem.gate.approver": approver,
                },
            )
        if not approve:
            message = f"rejected by {approver}: {rationale}"
            self._fail(gate_id, FailureClass.POLICY, message, attempt)
            self._stop(f"the plan stopped after gate {gate_id!r} was rejected")
        elif kind is GateKind.GATE:
            gate_output = {"approved": True, "approver": approver, "rationale": rationale}
            self._succeed(gate_id, gate_output, attempt, json.dumps(gate_output))
            self._release(gate_id)
        elif output is not None:
            self._succeed(gate_id, output, attempt, json.dumps(output))
            self._release(gate_id)
        else:  # re-run the reconciled step
            self.statuses[gate_id] = StepStatus.PENDING
            self.next_attempt[gate_id] = attempt + 1
            self.ready.appendleft(gate_id)
        if not self.gates and self.blocked:
            self.blocked = False
            if not self.stop_reason:
                plan = self.plan
                self._record(PlanStatusRecord(plan.id, plan.revision, PlanStatus.RUNNING))
                self._emit("", PlanStatus.RUNNING, 0)

    def _close_gates(self) -> None:
        """The plan stops with gates open: they end ``cancelled``."""
        for gate_id in list(self.gates):
            del self.gates[gate_id]
            self.statuses[gate_id] = StepStatus.CANCELLED
            message = self.stop_reason or "the plan ended"
            plan = self.plan
            self._record(
                StepResult(
                    plan.id,
                    plan.revision,
                    gate_id,
                    self.attempts.get(gate_id, 0),
                    StepStatus.CANCELLED,
                    failure_class=FailureClass.CANCELLED,
                    message=message,
                )
            )
            self._emit(gate_id, StepStatus.CANCELLED, 0, FailureClass.CANCELLED, message)

    def pause(self) -> None:
        """Start no new step; the run ends ``paused`` once the running steps finish."""
        if self.paused or self.stop_reason:
            return
        self.paused = True
        logger.info("plan %s@%d: pausing", self.plan.id, self.plan.revision)
        self._maybe_finish()

    def cancel(self) -> None:
        """Cancel the running steps, compensate, end ``cancelled``."""
        if self.cancelled:
            return
        self.cancelled = True
        self.paused = False
        logger.info("plan %s@%d: cancelling", self.plan.id, self.plan.revision)
        self.stop_reason = ""
        self._stop("the plan was cancelled")
        self._maybe_finish()


def _reconcile_prompt(step: Step) -> str:
    match step:
        case ToolStep():
            what = f"step {step.id!r} (tool {step.tool!r})"
        case CrossAgentStep():
            what = f"step {step.id!r} ({step.target}.{step.capability})"
        case GateStep():
            what = f"gate {step.id!r}"
        case _:
            assert_never(step)
    return f"{what} was in flight when the plan stopped; approve to re-run it, reject to fail it"
