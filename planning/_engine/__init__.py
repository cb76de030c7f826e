"""The engine: runs a plan's steps in dependency order, bounded, timed, retried and traced.

Scheduling is Kahn's algorithm driven by completions: every step whose dependencies have succeeded
starts as soon as a slot is free (``plan.max_in_flight``, else ``EngineConfig.max_in_flight``), and
each completion starts the steps it unblocks at once, not layer by layer. A step waiting out a
retry backoff keeps its slot.

Each attempt has a time limit (``step.timeout_s``, else ``EngineConfig.default_timeout_s``); when it
runs out the attempt is cancelled and fails with class ``timeout``. The limits of one run share one
event-loop timer (see ``_Watchdog``) with the semantics of ``asyncio.timeout``.

Tracing: a span ``invoke_agent {agent}`` per run and ``step {id}`` per attempt (a tool step's
attempt is its tool call: the span carries GenAI's ``execute_tool`` attributes); a cross-agent step
dispatches inside its step span, so the client's span is its child. Retries, gate openings and
decisions and compensations are events on the run span (``retry``, ``gate.blocked``,
``gate.decided``, ``compensation``). Step spans and the events are made only when the run span is
recording (``docs/telemetry.md`` has the whole model).

Failure handling is fail-fast. When a step fails for good (its class is not retried, or it ran out
of attempts), the engine starts nothing new and cancels the steps still running, so the plan ends
promptly; compensation of what already succeeded is a separate concern. At the end:

- a step that started and was interrupted is ``cancelled``;
- a step that never started is ``skipped``;
- the plan is ``failed`` and ``PlanResult.failures`` lists the steps that failed (not the ones
  cancelled or skipped because of them).

When the task running ``Engine.run`` is itself cancelled, the running steps are cancelled and
awaited, every step gets its final event (``cancelled`` or ``skipped``), the plan's final event is
``cancelled``, and ``asyncio.CancelledError`` propagates.

Events: every transition emits a ``StepEvent`` to ``on_event``, synchronously and in order. For a
plan: ``running`` first and its final status last (``step_id == ""``). For a step: ``running``
(attempt 1), then per failed, retried attempt ``retrying`` (with the failure, ``delay_s`` and the
delay in the message) followed by ``running`` for the next attempt, then exactly one of
``succeeded``, ``failed``, ``cancelled`` or ``skipped`` (a ``skipped`` step has no ``running``).
An exception from ``on_event`` is logged and otherwise ignored: observers cannot change a run.

Backoff jitter comes from a ``random.Random`` seeded from ``EngineConfig.seed`` and the step's run
id, so the same plan and seed give the same delays however the steps interleave.

Durability (only with ``Engine(store=...)``; ``docs/durability.md`` has the whole story): a run's
records go through a ``_Journal`` that commits each tick's records in one transaction; a step task
awaits the commit of its intent before calling its tool or dispatching, and ``run`` returns after
the final status is committed. With a store, cancelling the task running ``run`` is an
interruption (nothing more is recorded; ``resume`` continues), while ``Engine.cancel`` cancels the
plan for good and compensates. Gate steps and reconcile gates hold the plan ``blocked`` until
``Engine.decide``; when a plan fails or is cancelled, the compensations of succeeded steps run in
reverse completion order before the final status. Gates that ask carry a value, gates time out
and escalate (``docs/gates.md``), and the policy's ``ToolApproval``s hold a tool step at a tool
gate until approved. An idempotent step of a plan without a budget
does not wait for its intent's commit (``_StepRunner.needs_durable_intent`` says why that is safe).

Failure policy (``_policy.FailurePolicy``, the one place these rules live): ``transient`` and
``timeout`` are retried; ``logic`` stops the run, and with a ``replanner`` the engine makes a new
revision (``planning._revisions``) and continues with it; ``policy`` fails the plan, or holds a
step with ``on_policy_failure="gate"`` at a policy gate. Budgets (``Plan.budget``) are reserved
before each attempt, and per-tool circuit breakers (``CircuitBreakerConfig``) refuse attempts of a
failing tool; both fail with class ``policy``.

Where things are. ``Engine`` (``_engine``) keeps the active runs by plan id and makes one
``_run._PlanRun`` per revision it runs, handing it a ``_deps.RunDeps`` (its services and settings,
never its own attributes). A run is parts composed around one state object (STYLE rule 20):

- ``_state``: ``_RunState``, the run's state and its only writer: every transition (a step
  starts, retries, succeeds, fails, is cancelled or skipped; a gate opens or closes; the plan
  stops, pauses, is cancelled; a compensation runs) is one of its methods, which journals the
  change and tells the observer;
- ``_observe``: ``_Observer``, ``StepEvent``s, metrics, the plan span's events and links;
- ``_gates``: ``_Gates``, gate steps, reconcile, policy and tool gates, what a gate asks, who
  may decide it, its deadline and escalation (journaled, armed again on resume), decisions, the
  notices a ``GateNotifier`` is told (``_gate_model``: what a gate is apart from the run);
- ``_restore``: ``_Restore``, a resumed run takes its journal's state;
- ``_attempts``: ``_Attempts``, the one attempt loop (``retry``), spans, time limits and the
  classification of exceptions; ``_StepRunner``/``_StepTries``, what is recorded around a step's
  attempts;
- ``_compensation``: ``_Compensation``, compensations through the same loop;
- ``_schedule``: ``_Scheduler``, start ready steps, settle finished ones;
- ``_run``: ``_PlanRun``, builds the parts (each with the state and only the services it uses)
  and runs them: the plan span, the end of the run, replanning (``_revise``).

Beside them: ``_policy`` (``FailurePolicy``, budget admission and the circuit breakers),
``_journal`` (one store commit per tick), ``_watchdog`` (one timer for all deadlines),
``_revise`` (a plan's next revision), ``_fork`` (a new plan from a stored one, its results
before the fork point carried) and ``_types`` (the public configuration and values).
"""

from stratagem.planning._engine._engine import Engine
from stratagem.planning._engine._types import (
    CircuitBreakerConfig,
    EngineConfig,
    GateNotice,
    GateNotifier,
    PlanResult,
    StepEvent,
    ToolApproval,
    ToolContext,
    ToolRunner,
)

__all__ = [
    "CircuitBreakerConfig",
    "Engine",
    "EngineConfig",
    "GateNotice",
    "GateNotifier",
    "PlanResult",
    "StepEvent",
    "ToolApproval",
    "ToolContext",
    "ToolRunner",
]
