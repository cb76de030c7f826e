"""What an engine hands each of its runs: the services and settings, and nothing else."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from stratagem.planning._dispatch import Dispatcher
from stratagem.planning._engine._policy import FailurePolicy, _Breakers
from stratagem.planning._engine._types import EngineConfig, GateNotifier, ToolApproval, ToolRunner
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._revisions import Replanner
from stratagem.planning._store import StateStore


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
        notifier: Told when a gate opens, escalates or times out (``None``: no one).
        approvals: The policy's tool approvals (``Engine.approvals``).
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
    notifier: GateNotifier | None = None
    approvals: tuple[ToolApproval, ...] = ()
