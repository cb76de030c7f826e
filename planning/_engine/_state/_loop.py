"""A loop's (or a sub-plan's) ledger transitions: its iterations (``_RunState.iterations``), run
by ``_nested``."""

from __future__ import annotations

from typing import Any

from stratagem.planning._engine._state._core import _RunState
from stratagem.planning._engine._state._ledgers import _Iterations, expansion_key
from stratagem.planning._plan import StepStatus
from stratagem.planning._store import (
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    IterationRecord,
    Record,
)
from stratagem.planning._store._state import IterationOutcome


def iteration_started(
    state: _RunState[Any], step_id: str, iteration: int, at: float, recorded: bool
) -> None:
    """Iteration ``iteration`` of loop (or sub-plan) ``step_id`` starts its nested plan (the
    start journaled unless ``recorded``); the nested plan is to be compensated (or
    cancelled) if this plan fails or is cancelled."""
    loop = state.iterations.get(step_id)
    if loop is None:
        loop = state.iterations[step_id] = _Iterations()
    if loop.started_at is None:
        loop.started_at = at
    loop.start(iteration)
    key = expansion_key(step_id, iteration)
    new = key not in state.compensation
    if new:
        state.compensable.append(key)
        state.compensation[key] = CompensationStatus.NEEDED
    if recorded:
        return
    plan = state.plan
    records: list[Record] = [
        IterationRecord(plan.id, plan.revision, step_id, iteration, "started", at=at)
    ]
    if new:
        records.append(CompensationRecord(plan.id, plan.revision, key, CompensationStatus.NEEDED))
    state.record(*records)


def iteration_ended(
    state: _RunState[Any],
    step_id: str,
    iteration: int,
    outcome: IterationOutcome,
    value_json: str,
    outputs: dict[str, Any],
    spent: tuple[int, float],
    message: str,
) -> None:
    """Iteration ``iteration`` of ``step_id`` ended with ``outcome``; what its nested plan
    spent is charged to this plan's budget, in the same commit as the outcome."""
    loop = state.iterations[step_id]
    loop.ended = iteration
    loop.last = outputs
    loop.holds = outcome == "held"
    loop.failed = outcome == "failed"
    plan = state.plan
    records: list[Record] = [
        IterationRecord(plan.id, plan.revision, step_id, iteration, outcome, value_json)
    ]
    if spent != (0, 0.0):
        records.append(BudgetRecord(plan.id, plan.revision, spent[0], spent[1]))
    state.record(*records)
    if message:
        state.observer.emit(step_id, StepStatus.RUNNING, iteration, message=message)


def load_iteration(state: _RunState[Any], record: IterationRecord) -> None:
    """A resumed run finds an iteration record of a loop (or sub-plan) it has not finished."""
    loop = state.iterations.get(record.step_id)
    if loop is None:
        loop = state.iterations[record.step_id] = _Iterations()
    if record.outcome == "started":
        if loop.started_at is None:
            loop.started_at = record.at
        loop.start(record.iteration)
    else:
        loop.ended = record.iteration
        loop.holds = record.outcome == "held"
        loop.failed = record.outcome == "failed"


def load_iteration_outputs(
    state: _RunState[Any], step_id: str, outputs: dict[str, Any] | None
) -> None:
    """The outputs of the latest ended iteration of ``step_id``, read from its nested plan."""
    state.iterations[step_id].last = outputs
