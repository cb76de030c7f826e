"""What an engine hands each of its runs: the services and settings, and nothing else."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from stratagem.planning._artifacts._claim import ClaimCheck
from stratagem.planning._dispatch import Dispatcher
from stratagem.planning._engine._policy import FailurePolicy, _Breakers
from stratagem.planning._engine._types import EngineConfig, GateNotifier, ToolApproval, ToolRunner
from stratagem.planning._errors import StepFailure
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import Plan, PlanStatus
from stratagem.planning._revisions import Replanner
from stratagem.planning._store import StateStore


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How a nested plan (a sub-plan, a loop's iteration) ended, as the step running it sees it.

    Attributes:
        status: Its final status.
        outputs: Step id -> output, for its steps that succeeded.
        failures: Its failures.
        calls: Tool calls it reserved (charged to the parent's budget).
        cost: Cost units it reserved.
    """

    status: PlanStatus
    outputs: dict[str, Any]
    failures: list[StepFailure] = field(default_factory=list)
    calls: int = 0
    cost: float = 0.0


class Children(Protocol):
    """Runs the nested plans of a run's steps with the engine that runs the run (``Engine``
    implements it): the same agent, tools, store and control (each nested plan is reachable by
    its own id while it runs)."""

    async def run(self, plan: Plan, started: Callable[[object], None] | None = None) -> ChildResult:
        """Run ``plan`` to its end; a plan already stored is resumed, or its recorded result
        read back when it is finished. Without a store, ``started`` is given the nested run
        before it starts (to undo it later, even if it is interrupted)."""
        ...

    async def outputs(self, plan_id: str) -> dict[str, Any] | None:
        """The recorded outputs of a stored nested plan (``None``: not stored)."""
        ...

    async def compensate(self, plan_id: str, handle: object | None, status: PlanStatus) -> str:
        """Undo a nested plan because its parent ended ``status``: cancel it if it is not
        finished (it compensates itself then), or compensate its succeeded steps. Returns why a
        compensation failed ("" when none did)."""
        ...


@dataclass(frozen=True, slots=True)
class RunDeps:
    """The dependencies of one run, made by ``Engine`` from its own (one per run, so a change
    to the engine's settings between runs is seen by the next run, never by a running one).

    Each part of the run takes from it only what it uses (``_run._PlanRun`` hands them out).

    Attributes:
        config: The engine's configuration (bounds, default time limit, seed, replans).
        tools: Runs the agent's tools.
        dispatcher: Sends cross-agent steps (``None``: such steps fail with a logic failure).
        agent: The agent's role.
        agent_id: ``gen_ai.agent.id`` on the plan span.
        tracer: Makes the plan and step spans.
        metrics: Counts plans, steps and retries.
        sleep: Waits out retry backoffs.
        clock: Wall-clock time, for budgets, breakers and revisions.
        store: Where the run's journal goes (``None``: nowhere).
        replanner: Asked for a new revision after a logic failure (``None``: none).
        policy: What follows a failure.
        breakers: The engine's per-tool circuit breakers, shared by its runs.
        children: Runs the nested plans of sub-plan and loop steps.
        notifier: Told when a gate opens, escalates or times out (``None``: no one).
        approvals: The policy's tool approvals (``Engine.approvals``).
        claim_check: Where tool outputs too large to journal inline go (``None``: inline).
    """

    config: EngineConfig
    tools: ToolRunner
    dispatcher: Dispatcher | None
    agent: str
    agent_id: str
    tracer: Tracer
    metrics: PlanningMetrics
    sleep: Callable[[float], Awaitable[object]]
    clock: Callable[[], float]
    store: StateStore | None
    replanner: Replanner | None
    policy: FailurePolicy
    breakers: _Breakers
    children: Children
    notifier: GateNotifier | None = None
    approvals: tuple[ToolApproval, ...] = ()
    claim_check: ClaimCheck | None = None
