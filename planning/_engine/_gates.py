"""Gates: gate steps, reconcile, policy and tool gates, their deadlines and their decisions.

``_Gates`` decides what a gate's decision does (and what a gate asks, who may decide it, when it
times out or escalates); the run's state makes the transitions. Besides the state it holds only
what the gates alone need: decisions given before their gate step was reached, the prompts of
policy gates, what each open gate is (its deciders, deadline and escalation, ``Open``), the
gates whose opening is in the journal already and those a resumed run has yet to announce, the
tool steps approved in this run, and the timers of the open gates' deadlines.

A gate's deadline and escalation are journaled with its opening (``GateRecord.deadline``,
``escalate_at``) as wall-clock times, so a resumed run arms them again for what is left (or
fires them at once). What a deadline does is committed before it is acted on, and only to a
gate still open and not being decided: it happens once, whatever restarts come between. A
``GateNotifier`` is told of an opening once it is committed, and of an escalation or a timeout
before it is acted on; a resumed run tells again what it cannot know was told (same key).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from stratagem.planning._engine._gate_model import (
    Edit,
    Open,
    Rule,
    check_decision_input,
    gate_rule,
    reconcile_prompt,
    seconds,
    step_deciders,
    take_recorded,
    tool_prompt,
    tool_rule,
)
from stratagem.planning._engine._observe import _Observer
from stratagem.planning._engine._state import _RunState
from stratagem.planning._engine._types import (
    GateEvent,
    GateNotice,
    GateNotifier,
    ToolApproval,
    ToolRunner,
)
from stratagem.planning._errors import (
    ExpressionError,
    GateDeciderError,
    GateDecisionError,
    RefError,
)
from stratagem.planning._expr import expression, truthy
from stratagem.planning._gate_input import VALUE
from stratagem.planning._kinds import is_decided
from stratagem.planning._plan import (
    FailureClass,
    GateStep,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._refs import has_refs, resolve_refs
from stratagem.planning._store import (
    TIMEOUT_APPROVER,
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
)

logger = logging.getLogger(__name__)


class _Gates:
    """The run's gates: opening them, their deadlines, checking and applying decisions.

    Args:
        state: The run's state.
        observer: Told of decisions (span events).
        tools: Asked whether an approver's edited arguments fit a tool (``input_problems``).
        clock: Wall-clock time, for deadlines.
        notifier: Told when a gate opens, escalates or times out (``None``: no one).
        approvals: The policy's tool approvals.
        deadlines: Whether gates time out and escalate by themselves.
        agent: The agent's role (named in notices).
        wake: Starts what a decision made ready (the scheduler's ``wake``).
    """

    def __init__(
        self,
        state: _RunState[Any],
        observer: _Observer,
        *,
        tools: ToolRunner | None = None,
        clock: Callable[[], float] | None = None,
        notifier: GateNotifier | None = None,
        approvals: Sequence[ToolApproval] = (),
        deadlines: bool = True,
        agent: str = "",
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.state = state
        self.observer = observer
        self.tools = tools
        self.clock = clock if clock is not None else time.time
        self.notifier = notifier
        self.approvals = tuple(approvals)
        self.deadlines = deadlines
        self.agent = agent
        self.wake = wake
        self.decisions: dict[str, GateState] = {}  # decided before their gate step was reached
        self.prompts: dict[str, str] = {}  # policy gates: the prompt naming the failure
        self.recorded: set[str] = set()  # gates whose opening is in the journal
        self.unannounced: list[str] = []  # gates a resumed run found open, not yet announced
        self.found: dict[str, GateState] = {}  # their recorded state
        self.open: dict[str, Open] = {}
        self.deciding: set[str] = set()  # gates whose decision is being committed
        self.approved: set[str] = set()  # tool steps approved in this run
        self.approved_notices: dict[str, GateNotice] = {}  # told by the step's next start
        self.revision: Edit | None = None  # an approval that edited a tool's arguments
        self.timers: dict[str, list[asyncio.TimerHandle]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    # --- opening gates ----------------------------------------------------------------------

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
            self.decide_recorded(decision, GateKind.GATE)
            return
        self.announce(step.id, GateKind.GATE)

    def ask_approval(self, step: ToolStep) -> bool:
        """Whether ``step`` waits for an approval the policy asks for its tool (opening its tool
        gate); False when it may start."""
        if step.id in self.approved:
            return False
        rules = [rule for rule in self.approvals if rule.tool == step.tool]
        if not rules:
            return False
        state = self.state
        arguments: Any = step.input
        if has_refs(arguments):
            try:
                arguments = resolve_refs(arguments, state.outputs, state.plan.inputs)
            except RefError:  # the step runs and fails on its reference, as without approval
                return False
        if not isinstance(arguments, dict):
            return False
        for rule in rules:
            if self._applies(rule, arguments):
                self.open[step.id] = Open(
                    GateKind.TOOL,
                    tool_prompt(step, rule, arguments),
                    self.clock(),
                    deciders=rule.deciders,
                    rule=Rule(
                        rule.timeout_s,
                        rule.on_timeout,
                        None,
                        rule.escalate_after_s,
                        rule.escalate_to,
                    ),
                    tool=step.tool,
                    arguments=arguments,
                )
                self.announce(step.id, GateKind.TOOL)
                return True
        return False

    def _applies(self, rule: ToolApproval, arguments: dict[str, Any]) -> bool:
        if rule.when is None:
            return True
        try:
            return truthy(expression(rule.when).evaluate({"arguments": arguments}, None))
        except ExpressionError as exc:  # an approval that cannot be judged is asked for
            logger.warning("tool approval of %s: %s; asking anyway", rule.tool, exc)
            return True

    def announce(self, gate_id: str, kind: GateKind) -> None:
        """Open gate ``gate_id`` (of ``kind``) and say so: events, the opening recorded once,
        its deadline and escalation armed, the notifier told."""
        state = self.state
        step = state.steps[gate_id]
        found = self.found.pop(gate_id, None)
        gate = self.open.get(gate_id)
        if gate is None:
            gate = self.open[gate_id] = self._opening(step, kind, found)
        elif found is not None:
            take_recorded(gate, found)
        recorded = gate_id in self.recorded  # a resumed run finds some recorded already
        self.recorded.add(gate_id)
        plan = state.plan
        record = None
        if not recorded:
            record = GateRecord(
                plan.id,
                plan.revision,
                gate_id,
                GateDecision.OPEN,
                kind,
                prompt=gate.prompt,
                at=gate.at,
                arguments_json=None if gate.arguments is None else json.dumps(gate.arguments),
                deadline=gate.deadline,
                escalate_at=gate.escalate_at,
                deciders=gate.deciders,
                escalated=gate.escalated,
            )
        notice = self._notice(gate_id, gate, "escalated" if gate.escalated else "opened")
        committed = state.block(gate_id, kind, gate.prompt, record, notice)
        self._spawn(self._tell(notice, committed))
        self._arm(gate_id, gate)

    def _opening(self, step: Step, kind: GateKind, found: GateState | None) -> Open:
        """What a gate opening now is (or, for ``found``, what it was recorded as)."""
        prompt = self.prompts.get(step.id) or (
            step.prompt if is_decided(step) else reconcile_prompt(step)
        )
        rule = gate_rule(step) if is_decided(step) else None
        gate = Open(kind, prompt, self.clock())
        if is_decided(step):
            gate.deciders = tuple(step.deciders)
        gate.rule = rule
        if rule is not None:
            if rule.timeout_s is not None:
                gate.deadline = gate.at + rule.timeout_s
            if rule.escalate_after_s is not None:
                gate.escalate_at = gate.at + rule.escalate_after_s
        if found is not None:
            take_recorded(gate, found)
        return gate

    def announce_found(self) -> None:
        """Announce the gates a resumed run found open (when the run starts)."""
        for gate_id in self.unannounced:
            self.announce(gate_id, self.state.gates[gate_id])
        self.unannounced.clear()

    def found_open(self, gate_id: str, kind: GateKind, recorded: GateState | None) -> None:
        """A resumed run finds gate ``gate_id`` open (announced when the run starts)."""
        self.state.open_gate(gate_id, kind)
        if recorded is not None:
            self.found[gate_id] = recorded
            if kind is GateKind.TOOL:
                step = self.state.steps[gate_id]
                assert isinstance(step, ToolStep)
                self.open[gate_id] = Open(
                    kind,
                    recorded.prompt,
                    recorded.opened_at or self.clock(),
                    rule=tool_rule(self.approvals, step.tool),
                    tool=step.tool,
                    arguments=recorded.arguments,
                )
        self.unannounced.append(gate_id)

    def found_policy_prompt(self, gate_id: str, prompt: str) -> None:
        """A resumed run finds a policy gate whose prompt names its failure."""
        if prompt:
            self.prompts[gate_id] = prompt

    def found_started(self, step_id: str) -> None:
        """A resumed run finds that ``step_id`` started: any approval its tool needed was given
        (a re-run after a reconcile gate does not ask again)."""
        self.approved.add(step_id)

    def found_waiting(self, gate: GateState) -> None:
        """A resumed run finds gate step ``gate`` open: it opens again when reached, with the
        deadline, escalation and deciders it was recorded with."""
        self.found[gate.gate_id] = gate

    def found_decided(self, decision: GateState) -> None:
        """A resumed run finds a decision for a gate step it has not reached yet."""
        self.decisions[decision.gate_id] = decision

    def found_tool(self, gate: GateState) -> None:
        """A resumed run finds the tool gate of a step that has not run (or was in flight)."""
        step_id = gate.gate_id
        status = self.state.statuses.get(step_id)
        if gate.decision is GateDecision.OPEN:
            if status is StepStatus.PENDING:
                self.found_open(step_id, GateKind.TOOL, gate)
            return
        if gate.decision is GateDecision.APPROVED and not gate.edited:
            self.approved.add(step_id)
        elif status is StepStatus.PENDING:  # decided, and the decision not acted on yet
            self.decide_recorded(gate, GateKind.TOOL)

    # --- deadlines and escalation ------------------------------------------------------------

    def _arm(self, gate_id: str, gate: Open) -> None:
        """Set the timers of an open gate's escalation and deadline (for what is left)."""
        self._disarm(gate_id)
        if not self.deadlines:
            return
        loop = self.state.loop
        now = self.clock()
        handles: list[asyncio.TimerHandle] = []
        if gate.escalate_at is not None and not gate.escalated:
            handles.append(
                loop.call_later(
                    max(0.0, gate.escalate_at - now),
                    self._on_timer,
                    gate_id,
                    "escalate",
                )
            )
        if gate.deadline is not None:
            handles.append(
                loop.call_later(max(0.0, gate.deadline - now), self._on_timer, gate_id, "expire")
            )
        if handles:
            self.timers[gate_id] = handles

    def _disarm(self, gate_id: str) -> None:
        for handle in self.timers.pop(gate_id, ()):
            handle.cancel()

    def _on_timer(self, gate_id: str, what: Literal["escalate", "expire"]) -> None:
        gate = self.open.get(gate_id)
        if gate is None or gate_id not in self.state.gates or gate_id in self.deciding:
            return
        if what == "escalate":
            gate.escalate_at = None
            self._escalate(gate_id, gate, f"undecided after {seconds(gate.rule, 'escalate')}")
            return
        self._spawn(self._expire(gate_id, gate))

    def _escalate(self, gate_id: str, gate: Open, why: str) -> None:
        """Hand the open gate to its escalation's deciders: journaled, told, shown."""
        rule = gate.rule
        if rule is None or not rule.escalate_to or gate.escalated:
            return
        gate.deciders = rule.escalate_to
        gate.escalated = True
        gate.escalate_at = None
        gate.at = self.clock()
        plan = self.state.plan
        record = GateRecord(
            plan.id,
            plan.revision,
            gate_id,
            GateDecision.OPEN,
            gate.kind,
            prompt=gate.prompt,
            at=gate.at,
            arguments_json=None if gate.arguments is None else json.dumps(gate.arguments),
            deadline=gate.deadline,
            deciders=gate.deciders,
            escalated=True,
        )
        notice = self._notice(gate_id, gate, "escalated")
        message = f"escalated to {', '.join(gate.deciders)} ({why}): {gate.prompt}"
        committed = self.state.escalate_gate(gate_id, record, notice, message)
        self._spawn(self._tell(notice, committed))

    async def _expire(self, gate_id: str, gate: Open) -> None:
        """The gate's deadline passed: what ``on_timeout`` says, committed, told, then done
        (unless the gate closed, or a person's decision is being committed, meanwhile)."""
        rule = gate.rule
        if rule is None or gate_id not in self.state.gates or gate_id in self.deciding:
            return
        waited = f"no decision within {rule.timeout_s:g}s"
        if rule.on_timeout == "escalate":
            gate.deadline = None
            self._escalate(gate_id, gate, waited)
            return
        approve = rule.on_timeout != "reject"
        has_value = rule.on_timeout == "default"
        value = rule.default if has_value else None
        rationale = f"{waited} (on_timeout: {rule.on_timeout})"
        plan = self.state.plan
        record = GateRecord(
            plan.id,
            plan.revision,
            gate_id,
            GateDecision.APPROVED if approve else GateDecision.REJECTED,
            gate.kind,
            approver=TIMEOUT_APPROVER,
            rationale=rationale,
            at=self.clock(),
            value_json=json.dumps(value) if has_value else None,
        )
        self.deciding.add(gate_id)
        try:
            await self.state.write(record)
        except BaseException:
            self.deciding.discard(gate_id)
            raise
        notice = self._notice(
            gate_id,
            gate,
            "timed_out",
            at=record.at,
            decision=record.decision.value,
            approver=TIMEOUT_APPROVER,
            rationale=rationale,
            value=value,
            has_value=has_value,
        )
        await self._tell(notice, None)
        if self.apply_decision(
            gate_id, approve, TIMEOUT_APPROVER, rationale, None, value, has_value, None
        ):
            self.wake()

    def close(self) -> None:
        """The run ends: no deadline fires any more."""
        for gate_id in list(self.timers):
            self._disarm(gate_id)

    # --- notices -----------------------------------------------------------------------------

    def _notice(self, gate_id: str, gate: Open, event: GateEvent, **more: Any) -> GateNotice:
        step = self.state.steps[gate_id]
        plan = self.state.plan
        asks = is_decided(step) and gate.kind is GateKind.GATE
        fields: dict[str, Any] = {
            "at": gate.at,
            "agent": self.agent,
            "prompt": gate.prompt,
            "deciders": gate.deciders,
            "deadline": gate.deadline,
            "escalate_at": None if gate.escalated else gate.escalate_at,
            "input_schema": step.input_schema if asks and is_decided(step) else None,
            "choices": (
                tuple(step.choices)
                if asks and is_decided(step) and step.choices is not None
                else None
            ),
            "tool": gate.tool,
            "arguments": gate.arguments,
        }
        fields.update(more)
        return GateNotice(plan.id, plan.revision, gate_id, gate.kind, event, **fields)

    async def _tell(self, notice: GateNotice, committed: asyncio.Future[None] | None) -> None:
        """Tell the notifier, once ``committed`` (the record the notice is about) is."""
        notifier = self.notifier
        if notifier is None:
            return
        if committed is not None:
            await committed
            journal = self.state.journal
            if journal is not None and journal.error is not None:
                return  # not committed: a resumed run tells it
        try:
            await notifier.notify(notice)
        except Exception:
            logger.exception("plan %s gate %s: the notifier failed", notice.plan_id, notice.gate_id)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = self.state.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # a bug, or the store failed: the run must not hang
            logger.error("plan %s: a gate's deadline failed: %s", self.state.plan.id, exc)
            self.state.crash(exc)

    # --- decisions ---------------------------------------------------------------------------

    def check_decision(
        self,
        gate_id: str,
        revision: int,
        output: dict[str, Any] | None,
        *,
        approve: bool = True,
        approver: str = "",
        value: Any = None,
        has_value: bool = False,
        arguments: dict[str, Any] | None = None,
        may_decide: Callable[[Sequence[str]], bool] | None = None,
    ) -> GateKind:
        """The kind of gate a decision applies to; raises ``GateDecisionError`` when none (a
        ``GateDeciderError`` for someone the gate is not for, a ``GateValueError`` for a value
        or arguments that do not fit). The gate is then being decided until ``apply_decision``
        (or ``release``)."""
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
        step = state.steps.get(gate_id)
        if kind is None:
            if not (
                step is not None
                and is_decided(step)
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
        if gate_id in self.deciding:
            raise GateDecisionError(
                plan.id, gate_id, revision, f"gate {gate_id!r} of plan {plan.id!r} is being decided"
            )
        gate = self.open.get(gate_id)
        deciders = gate.deciders if gate is not None else step_deciders(step)
        if may_decide is not None and not may_decide(deciders):
            raise GateDeciderError(plan.id, gate_id, revision, approver, deciders)
        assert step is not None
        check_decision_input(
            plan.id,
            revision,
            step,
            kind,
            approve=approve,
            output=output,
            value=value,
            has_value=has_value,
            arguments=arguments,
            tools=self.tools,
        )
        self.deciding.add(gate_id)
        return kind

    def release(self, gate_id: str) -> None:
        """A checked decision was not recorded (the store failed): others may decide."""
        self.deciding.discard(gate_id)

    def apply_decision(
        self,
        gate_id: str,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
        value: Any = None,
        has_value: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> bool:
        """Act on a recorded decision (``Engine.decide``); True when it closed an open gate
        (steps may then be ready)."""
        state = self.state
        self.deciding.discard(gate_id)
        kind = state.close_gate(gate_id)
        self._disarm(gate_id)
        if kind is None:
            found = state.steps.get(gate_id)
            if (
                found is not None
                and is_decided(found)
                and state.statuses[gate_id] is StepStatus.PENDING
            ):  # decided before the gate was reached
                decision = GateDecision.APPROVED if approve else GateDecision.REJECTED
                self.decisions[gate_id] = GateState(
                    gate_id,
                    GateKind.GATE,
                    decision,
                    state.plan.revision,
                    approver=approver,
                    rationale=rationale,
                    value=value,
                    has_value=has_value,
                )
            else:
                logger.info("plan %s: gate %s closed before its decision", state.plan.id, gate_id)
            return False
        self.decide(
            gate_id, kind, approve, approver, rationale, output, value, has_value, arguments
        )
        return True

    def decide_recorded(self, gate: GateState, kind: GateKind) -> None:
        """Apply a recorded decision (found by a resumed run, or given before its gate); one
        its deadline made is told again (the run may have stopped before it was)."""
        approve = gate.decision is GateDecision.APPROVED
        if gate.timed_out:
            opened = Open(kind, gate.prompt, gate.opened_at or self.clock())
            opened.deciders, opened.deadline = gate.deciders, gate.deadline
            notice = self._notice(
                gate.gate_id,
                opened,
                "timed_out",
                decision=gate.decision.value,
                approver=gate.approver,
                rationale=gate.rationale,
                value=gate.value,
                has_value=gate.has_value,
            )
            self._spawn(self._tell(notice, None))
        self.decide(
            gate.gate_id,
            kind,
            approve,
            gate.approver,
            gate.rationale,
            gate.output,
            gate.value,
            gate.has_value,
            gate.arguments if gate.edited else None,
        )

    def decide(
        self,
        gate_id: str,
        kind: GateKind,
        approve: bool,
        approver: str,
        rationale: str,
        output: dict[str, Any] | None,
        value: Any = None,
        has_value: bool = False,
        arguments: dict[str, Any] | None = None,
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
        gate = self.open.pop(gate_id, None)
        attempt = state.attempts.get(gate_id, 0)
        self.observer.gate_decided(gate_id, kind, approve, approver)
        timed_out = approver == TIMEOUT_APPROVER
        notice = self._notice(
            gate_id,
            gate if gate is not None else Open(kind, "", self.clock()),
            "timed_out" if timed_out else "decided",
            decision="approved" if approve else "rejected",
            approver=approver,
            rationale=rationale,
            value=value,
            has_value=has_value,
            arguments=arguments if arguments is not None else (gate.arguments if gate else None),
        )
        if not approve:
            message = (
                f"timed out: {rationale}" if timed_out else f"rejected by {approver}: {rationale}"
            )
            state.fail(
                gate_id,
                FailureClass.POLICY,
                message,
                attempt,
                stop=f"the plan stopped after gate {gate_id!r} was rejected",
                gate=notice,
            )
        elif kind is GateKind.GATE:
            gate_output: dict[str, Any] = {
                "approved": True,
                "approver": approver,
                "rationale": rationale,
            }
            step = state.steps[gate_id]
            if is_decided(step) and step.asks:
                gate_output[VALUE] = value
            if timed_out:
                gate_output["timed_out"] = True
            state.succeed(gate_id, gate_output, attempt, json.dumps(gate_output), gate=notice)
        elif kind is GateKind.TOOL:
            if arguments is not None:
                self.revision = Edit(gate_id, arguments, approver, rationale)
                state.revising(gate_id)
            else:
                self.approved.add(gate_id)
                self.approved_notices[gate_id] = notice
                state.requeue(gate_id, attempt + 1)
        elif output is not None:
            state.succeed(gate_id, output, attempt, json.dumps(output), gate=notice)
        else:  # re-run the reconciled (or held) step
            state.requeue(gate_id, attempt + 1)
        state.unblock()
