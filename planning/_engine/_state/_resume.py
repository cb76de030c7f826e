"""A resumed run takes its journal's state (``_restore``): the steps' outcomes, attempts and
compensations as recorded, then what is ready."""

from __future__ import annotations

from typing import Any

from stratagem.planning._engine._state._core import _RunState
from stratagem.planning._errors import StepFailure
from stratagem.planning._plan import FailureClass, StepStatus
from stratagem.planning._store import CompensationState, CompensationStatus, StepResult


def load_cancel_request(state: _RunState[Any]) -> None:
    """The journal holds a cancellation: the run compensates and ends ``cancelled``."""
    state.cancelled = True
    state.stop_reason = "the plan was cancelled"


def load_succeeded(state: _RunState[Any], step_id: str, output: Any, attempt: int) -> None:
    """``step_id`` had succeeded (its dependents' readiness is computed by ``load_ready``)."""
    state.attempts[step_id] = attempt
    state.outputs[step_id] = output
    state.statuses[step_id] = StepStatus.SUCCEEDED
    for dependent in state.dependents[step_id]:
        state.waiting[dependent] -= 1


def load_failed(state: _RunState[Any], failure: StepFailure) -> None:
    """``failure.step_id`` had failed: the run stops, unless a route handles the failure or
    independent steps go on."""
    step_id = failure.step_id
    state.attempts[step_id] = failure.attempts
    state.statuses[step_id] = StepStatus.FAILED
    if step_id in state.routed:
        state.handled.append(failure)
    else:
        state.failures.append(failure)
    if not state.stops_on(step_id):
        _load_unsucceeded(state, step_id)
    elif not state.stop_reason:
        state.stop_reason = f"the plan stopped after step {step_id!r} failed"


def load_skipped(state: _RunState[Any], step_id: str) -> None:
    """``step_id`` had been skipped (its dependents' readiness is computed by
    ``load_ready``)."""
    state.statuses[step_id] = StepStatus.SKIPPED
    state.undecided.discard(step_id)
    _load_unsucceeded(state, step_id)


def _load_unsucceeded(state: _RunState[Any], step_id: str) -> None:
    for dependent in state.dependents[step_id]:
        state.blocked_by.setdefault(dependent, step_id)
        state.undecided.add(dependent)
        state.waiting[dependent] -= 1


def load_attempt(
    state: _RunState[Any], step_id: str, attempt: int, status: StepStatus | None = None
) -> None:
    """``step_id``'s latest attempt was ``attempt`` (and its status ``status``, if given)."""
    state.attempts[step_id] = attempt
    if status is not None:
        state.statuses[step_id] = status


def load_resumed_mid_way(state: _RunState[Any], step_id: str, attempt: int) -> None:
    """``step_id`` continues at ``attempt`` (after a retried or an interrupted attempt)."""
    state.next_attempt[step_id] = attempt


def load_cancelled_in_flight(
    state: _RunState[Any], step_id: str, attempt: int, message: str
) -> None:
    """``step_id`` was in flight when a plan that is ending stopped: it is not re-run."""
    plan = state.plan
    state.statuses[step_id] = StepStatus.CANCELLED
    state.record(
        StepResult(
            plan.id,
            plan.revision,
            step_id,
            attempt,
            StepStatus.CANCELLED,
            failure_class=FailureClass.CANCELLED,
            message=message,
        )
    )


def load_compensation(state: _RunState[Any], entry: CompensationState) -> None:
    """A succeeded step's compensation, as the journal has it."""
    step_id = entry.step_id
    state.compensable.append(step_id)
    state.compensation[step_id] = entry.status
    state.compensation_attempts[step_id] = entry.attempt
    if step_id not in state.statuses:  # a map's item or an iteration
        return
    if entry.status is CompensationStatus.COMPENSATED:
        state.statuses[step_id] = StepStatus.COMPENSATED
    elif entry.status is CompensationStatus.FAILED:
        state.statuses[step_id] = StepStatus.COMPENSATION_FAILED


def load_ready(state: _RunState[Any]) -> None:
    """The pending steps whose dependencies have all settled are ready (once each)."""
    queued = set(state.ready)
    state.ready.extend(
        step.id
        for step in state.plan.steps
        if state.statuses[step.id] is StepStatus.PENDING
        and state.waiting[step.id] == 0
        and step.id not in queued
    )


def load_finished(
    state: _RunState[Any],
    statuses: dict[str, StepStatus],
    outputs: dict[str, Any],
    failures: list[StepFailure],
) -> None:
    """A finished plan's recorded statuses, outputs and failures (nothing runs)."""
    for step_id, status in statuses.items():
        if step_id in state.statuses:
            state.statuses[step_id] = status
    state.outputs.update((k, v) for k, v in outputs.items() if k in state.statuses)
    state.failures.extend(f for f in failures if f.step_id in state.statuses)
    for step_id, status in state.statuses.items():
        if status is StepStatus.PENDING:
            state.statuses[step_id] = StepStatus.SKIPPED
