"""The engine's configuration and the values it takes and gives: tool runner, events, results."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._errors import PlanFailedError, StepFailure
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, StepStatus

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
    """

    max_in_flight: int = 4
    default_timeout_s: float = 30.0
    seed: int = 0
    max_replans: int = 1
    circuit_breaker: CircuitBreakerConfig | None = CircuitBreakerConfig()

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
    """

    status: PlanStatus
    outputs: dict[str, Any]
    failures: list[StepFailure]
    statuses: dict[str, StepStatus]
    events: int
    duration_s: float
    submitted: P = field(repr=False)

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
