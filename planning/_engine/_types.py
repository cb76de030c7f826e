"""The engine's configuration and the values it takes and gives: tool runner, events, results."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, Literal, Protocol, TypeVar

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._errors import PlanFailedError, StepFailure
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, StepStatus
from stratagem.planning._store import GateKind

P = TypeVar("P", bound=Plan)


@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    """When a tool's circuit breaker opens and for how long.

    The breaker counts a tool's consecutive failed attempts (``transient`` and ``timeout``
    failures, across every plan of the engine; a success resets the count). At
    ``failure_threshold`` it opens: attempts of steps calling the tool fail with a ``policy``
    failure without calling it. After ``reset_after_s`` one more call is let through (half-open):
    a success closes the breaker, a failure opens it again for another ``reset_after_s``. With a
    store the breaker is persisted, so a restart does not reset it.

    Attributes:
        failure_threshold: Consecutive failures that open the breaker.
        reset_after_s: How long it stays open.
    """

    failure_threshold: int = 5
    reset_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, not {self.failure_threshold}")
        if self.reset_after_s < 0:
            raise ValueError(f"reset_after_s must not be negative, not {self.reset_after_s}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How an engine runs plans.

    Attributes:
        max_in_flight: Steps running at once, unless the plan sets its own ``max_in_flight``.
        default_timeout_s: The limit on one attempt of a step without its own ``timeout_s``.
        seed: Seeds the backoff jitter; the same seed gives the same delays.
        max_replans: How many new revisions the engine's ``replanner`` may make in one run
            after logic failures.
        circuit_breaker: The per-tool circuit breakers; ``None`` turns them off.
        gate_deadlines: Whether gates time out and escalate by themselves (``timeout_s``,
            ``escalate_after_s``); a replay turns them off and gives the recorded decisions.
    """

    max_in_flight: int = 4
    default_timeout_s: float = 30.0
    seed: int = 0
    max_replans: int = 1
    circuit_breaker: CircuitBreakerConfig | None = CircuitBreakerConfig()
    gate_deadlines: bool = True

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {self.max_in_flight}")
        if not self.default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be positive, not {self.default_timeout_s}")
        if self.max_replans < 0:
            raise ValueError(f"max_replans must not be negative, not {self.max_replans}")


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the step attempt it serves.

    Attributes:
        plan_id: The plan.
        step_id: The step.
        attempt: The attempt number, from 1.
        agent: The role of the agent running the plan.
        revision: The plan's revision.
        compensating: True when the call runs the step's compensating tool (``attempt`` then
            counts the compensation's attempts).
    """

    plan_id: str
    step_id: str
    attempt: int
    agent: str
    revision: int = 1
    compensating: bool = False

    @property
    def call_id(self) -> str:
        """The step's run id, ``f"{plan_id}@{revision}:{step_id}"``: the same on every attempt."""
        return step_run_id(self.plan_id, self.revision, self.step_id)


class ToolRunner(Protocol):
    """Runs a named tool of the agent (``agents.ToolRegistry`` implements it).

    The runner validates ``input`` against the tool's own model; the engine passes it as planned
    (references resolved) and never copies it, so a tool must not mutate it.

    Besides ``run_tool``, the engine asks the runner two things about a tool, by name: whether it
    is idempotent (``is_idempotent``) and what a call costs (``cost``). A runner that subclasses
    this protocol inherits the defaults (no idempotent tools, every call 1.0 cost units); a runner
    that only matches it structurally defines both.

    A runner may also have ``input_problems(name, input) -> list[str]``: what is wrong with
    ``input`` as tool ``name``'s input, one line each naming the field (``"amount: Input should
    be a valid number"``). The engine asks it about arguments an approver edited at a tool's
    approval gate before it takes them (``agents.ToolRegistry`` has it); without it they are
    checked when the tool runs. Likewise ``output_problems(name, output) -> list[str]``: the
    engine asks it about an output substituted for a tool step when a plan is forked; without it
    such an output is taken as given.
    """

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run tool ``name`` and return its JSON-like output.

        Raises:
            StepError: To fail the step with a failure class (``TransientError`` is retried).
        """
        ...

    def is_idempotent(self, name: str) -> bool:
        """Whether running tool ``name`` twice with the same input is the same as running it once.

        When a plan resumes, a tool step that was in flight at the crash is re-run only when its
        tool is idempotent; otherwise it waits at a reconcile gate. With a store, an idempotent
        step of a plan without a budget does not wait for its intent's commit. The default: no.
        """
        return False

    def cost(self, name: str) -> float:
        """The cost units one call of tool ``name`` reserves from a plan's budget (default 1.0)."""
        return 1.0


GateEvent = Literal["opened", "escalated", "timed_out", "decided"]
"""What happened at a gate (``GateNotice.event``)."""


@dataclass(frozen=True, slots=True)
class GateNotice:
    """What happened at a gate: carried by the gate's ``StepEvent`` (and so by ``Watch``), and
    what a ``GateNotifier`` is told when a gate opens, escalates or times out.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        gate_id: The gate step, or the step a reconcile, policy or tool gate names.
        kind: What the gate is for.
        event: ``opened``, ``escalated``, ``timed_out`` or ``decided``.
        at: When it happened (the journaled record's time: the same after a restart).
        agent: The role of the agent that runs the plan.
        prompt: What the approver is asked.
        deciders: Who may decide now (empty: whoever the policy allows).
        deadline: When the gate times out (``None``: never).
        escalate_at: When it escalates (``None``: never, or it has).
        input_schema: The JSON Schema of the value an approval carries.
        choices: The values an approval may carry.
        tool: For a tool gate: the tool.
        arguments: For a tool gate: the arguments it would be called with (on ``decided``: as
            approved).
        decision: ``approved`` or ``rejected`` ("" while open).
        approver: Who decided (``"(timeout)"`` for its deadline).
        rationale: Why.
        value: The value an approval carried (``has_value``: whether it carried one).
        has_value: Whether the decision carried a value.
    """

    plan_id: str
    revision: int
    gate_id: str
    kind: GateKind
    event: GateEvent
    at: float
    agent: str = ""
    prompt: str = ""
    deciders: tuple[str, ...] = ()
    deadline: float | None = None
    escalate_at: float | None = None
    input_schema: dict[str, Any] | None = None
    choices: tuple[Any, ...] | None = None
    tool: str = ""
    arguments: dict[str, Any] | None = None
    decision: str = ""
    approver: str = ""
    rationale: str = ""
    value: Any = None
    has_value: bool = False

    @property
    def key(self) -> str:
        """The notice's identity: the same when a restarted agent tells it again (a receiver
        drops a key it has seen). It names the journaled opening (or, for a timeout, the
        deadline) the notice is about."""
        when = self.deadline if self.event == "timed_out" and self.deadline else self.at
        return f"{step_run_id(self.plan_id, self.revision, self.gate_id)}:{self.event}:{when!r}"


class GateNotifier(Protocol):
    """Told when a gate opens, escalates or times out (the runtime's webhook, say).

    ``notify`` returns once the notice is kept durably (it may be delivered later); it is called
    again with the same ``key`` after a restart when the engine cannot tell whether it was, so
    keeping a key twice must be harmless. Errors are logged by the engine; the run goes on.
    """

    async def notify(self, notice: GateNotice) -> None:
        """Keep ``notice`` for delivery (durably, when the notifier is durable)."""
        ...


@dataclass(frozen=True, slots=True)
class ToolApproval:
    """A rule of the policy: calls of ``tool`` need a person's approval first.

    Before a tool step of a matching tool starts, the engine opens a tool gate named after the
    step, showing the tool and the arguments it would be called with; approve lets it run
    (with the arguments as they are, or as the approver edited them: the plan then continues as
    a new revision authored by the approver), reject fails it with class ``policy``.

    Attributes:
        tool: The tool's name.
        when: An expression over ``arguments`` (the tool's input, references resolved), e.g.
            ``"arguments.amount > `100`"``; the approval is asked only when it is truthy
            (``None``: always). One that cannot be evaluated asks.
        prompt: What the approver is asked (the tool and its arguments are shown anyway).
        deciders: Who may decide (identities, or ``role:NAME``; empty: whoever the policy
            allows).
        timeout_s: Seconds after which ``on_timeout`` decides (``None``: never).
        on_timeout: ``reject``, ``approve`` or ``escalate`` (to ``escalate_to``).
        escalate_after_s: Seconds undecided after which the gate passes to ``escalate_to``.
        escalate_to: Who decides once it escalated.
    """

    tool: str
    when: str | None = None
    prompt: str = ""
    deciders: tuple[str, ...] = ()
    timeout_s: float | None = None
    on_timeout: Literal["reject", "approve", "escalate"] = "reject"
    escalate_after_s: float | None = None
    escalate_to: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One transition of a plan or of one of its steps.

    Attributes:
        plan_id: The plan.
        revision: The plan's revision.
        step_id: The step, or "" for the plan itself.
        status: The new status (a ``PlanStatus`` when ``step_id`` is "").
        attempt: The step's attempt (0 for plan events and never-started steps).
        failure_class: The failure's class, for ``retrying``, ``failed`` and ``cancelled``.
        message: A one-line description ("" when there is nothing to add).
        timestamp: Wall-clock time of the transition (``time.time()``).
        delay_s: For ``retrying``: the backoff before the next attempt.
        gate: For a gate's events (``blocked`` when it opens or escalates, its outcome when it
            is decided): what happened at the gate.
    """

    plan_id: str
    revision: int
    step_id: str
    status: StepStatus | PlanStatus
    attempt: int
    failure_class: FailureClass | None
    message: str
    timestamp: float
    delay_s: float | None = None
    gate: GateNotice | None = None


@dataclass(frozen=True)
class PlanResult(Generic[P]):
    """How a plan run ended.

    Attributes:
        status: ``succeeded``, ``failed``, ``cancelled`` (``Engine.cancel``) or ``paused``
            (``Engine.pause``; unstarted steps stay ``pending``).
        outputs: Step id -> output, for every step that succeeded.
        failures: The steps that failed, in the order they failed.
        statuses: Step id -> final status, in plan order.
        events: How many events the run emitted.
        duration_s: Wall time of the run.
        submitted: The plan as it was submitted (unchanged).
        handled: The steps that failed for good and whose failure a route on failure handled
            (``runs_on: failure``), in the order they failed: not the plan's failures.
    """

    status: PlanStatus
    outputs: dict[str, Any]
    failures: list[StepFailure]
    statuses: dict[str, StepStatus]
    events: int
    duration_s: float
    submitted: P = field(repr=False)
    handled: list[StepFailure] = field(default_factory=list)

    @cached_property
    def plan(self) -> P:
        """A copy of the submitted plan whose steps carry their final statuses."""
        steps = [
            step
            if step.status is self.statuses[step.id]
            else step.model_copy(update={"status": self.statuses[step.id]})
            for step in self.submitted.steps
        ]
        return self.submitted.model_copy(update={"steps": steps})

    def raise_for_status(self) -> None:
        """Raise ``PlanFailedError`` unless the plan succeeded."""
        if self.status is not PlanStatus.SUCCEEDED:
            raise PlanFailedError(self.submitted.id, self.failures)
