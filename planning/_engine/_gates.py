"""Gates: gate steps, reconcile and policy gates, and their decisions.

``_Gates`` decides what a gate's decision does (and what a gate asks); the run's state makes the
transitions. Besides the state it holds only what the gates alone need: decisions given before
their gate step was reached, the prompts of policy gates, the gates whose opening is in the
journal already and those a resumed run has yet to announce.
"""

from __future__ import annotations

import json
import logging
from typing import Any, assert_never

from stratagem.planning._engine._observe import _Observer
from stratagem.planning._engine._state import _RunState
from stratagem.planning._errors import GateDecisionError
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._store import GateDecision, GateKind, GateState

logger = logging.getLogger(__name__)


class _Gates:
    """The run's gates: opening them, checking and applying decisions."""

    def __init__(self, state: _RunState[Any], observer: _Observer) -> None:
        self.state = state
        self.observer = observer
        self.decisions: dict[str, GateState] = {}  # decided before their gate step was reached
        self.prompts: dict[str, str] = {}  # policy gates: the prompt naming the failure
        self.recorded: set[str] = set()  # gates whose opening is in the journal
        self.unannounced: list[str] = []  # gates a resumed run found open, not yet announced

    def hold(self, step: Step, attempts: int, message: str) -> None:
        """Hold the plan at a gate named after ``step``, which failed a policy check."""
        self.state.hold(step.id, attempts, message)
        self.prompts[step.id] = (
            f"step {step.id!r} failed a policy check: {message}; approve to re-run it, "
            f"reject to fail it"
        )
        self.announce(step.id, GateKind.POLICY)

    def reach(self, step: GateStep) -> None:
        """The scheduler reached gate step ``step``: apply an early decision, or open it."""
        decision = self.decisions.pop(step.id, None)
        if decision is not None:
            self.decide(
                step.id,
                GateKind.GATE,
                decision.decision is GateDecision.APPROVED,
                decision.approver,
                decision.rationale,
                None,
            )
            return
        self.announce(step.id, GateKind.GATE)

    def announce(self, gate_id: str, kind: GateKind) -> None:
        """Open gate ``gate_id`` (of ``kind``) and say so: events, the opening recorded once."""
        step = self.state.steps[gate_id]
        prompt = self.prompts.get(gate_id) or (
            step.prompt if isinstance(step, GateStep) else _reconcile_prompt(step)
        )
        recorded = gate_id in self.recorded  # a resumed run finds some recorded already
        self.recorded.add(gate_id)
        self.state.block(gate_id, kind, prompt, recorded)

    def announce_found(self) -> None:
        """Announce the gates a resumed run found open (when the run starts)."""
        for gate_id in self.unannounced:
            self.announce(gate_id, self.state.gates[gate_id])
        self.unannounced.clear()

    def found_open(self, gate_id: str, kind: GateKind, prompt: str = "") -> None:
        """A resumed run finds gate ``gate_id`` open (announced when the run starts)."""
        self.state.open_gate(gate_id, kind)
        if prompt:
            self.prompts[gate_id] = prompt
        self.unannounced.append(gate_id)

    def found_decided(self, decision: GateState) -> None:
        """A resumed run finds a decision for a gate step it has not reached yet."""
        self.decisions[decision.gate_id] = decision

    def check_decision(
        self, gate_id: str, revision: int, output: dict[str, Any] | None
    ) -> GateKind:
        """The kind of gate a decision applies to; raises ``GateDecisionError`` when none."""
        state = self.state
        plan = state.plan
        if revision != plan.revision:
            raise GateDecisionError(
                plan.id,
                gate_id,
                revision,
                f"plan {plan.id!r} is at revision {plan.revision}; a decision given for "
                f"revision {revision} does not apply to it",
            )
        kind = state.gates.get(gate_id)
        if kind is None:
            step = state.steps.get(gate_id)
            if not (
                isinstance(step, GateStep)
                and state.statuses[gate_id] is StepStatus.PENDING
                and gate_id not in self.decisions
            ):
                status = "unknown" if step is None else state.statuses[gate_id].value
                raise GateDecisionError(
                    plan.id,
                    gate_id,
                    revision,
                    f"plan {plan.id!r} has no open gate {gate_id!r} (the step is {status})",
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
    ) -> bool:
        """Act on a recorded decision (``Engine.decide``); True when it closed an open gate
        (steps may then be ready)."""
        state = self.state
        kind = state.close_gate(gate_id)
        if kind is None:
            if isinstance(state.steps.get(gate_id), GateStep) and (
                state.statuses[gate_id] is StepStatus.PENDING
            ):  # decided before the gate was reached
                decision = GateDecision.APPROVED if approve else GateDecision.REJECTED
                self.decisions[gate_id] = GateState(
                    gate_id,
                    GateKind.GATE,
                    decision,
                    state.plan.revision,
                    approver=approver,
                    rationale=rationale,
                )
            else:
                logger.info("plan %s: gate %s closed before its decision", state.plan.id, gate_id)
            return False
        self.decide(gate_id, kind, approve, approver, rationale, output)
        return True

    def decide(
        self,
        gate_id: str,
        kind: GateKind,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
    ) -> None:
        """Apply a decision on gate ``gate_id`` (closed already, or never opened)."""
        state = self.state
        logger.info(
            "plan %s gate %s %s by %s: %s",
            state.plan.id,
            gate_id,
            "approved" if approve else "rejected",
            approver,
            rationale,
        )
        attempt = state.attempts.get(gate_id, 0)
        self.observer.gate_decided(gate_id, kind, approve, approver)
        if not approve:
            message = f"rejected by {approver}: {rationale}"
            state.fail(
                gate_id,
                FailureClass.POLICY,
                message,
                attempt,
                stop=f"the plan stopped after gate {gate_id!r} was rejected",
            )
        elif kind is GateKind.GATE:
            gate_output = {"approved": True, "approver": approver, "rationale": rationale}
            state.succeed(gate_id, gate_output, attempt, json.dumps(gate_output))
        elif output is not None:
            state.succeed(gate_id, output, attempt, json.dumps(output))
        else:  # re-run the reconciled (or held) step
            state.requeue(gate_id, attempt + 1)
        state.unblock()


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
