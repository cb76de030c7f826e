"""A map step's ledger transitions: its items (``_RunState.expansions``), run by ``_map``."""

from __future__ import annotations

from typing import Any

from stratagem.planning._engine._state._core import _RunState
from stratagem.planning._engine._state._ledgers import _Items, expansion_key
from stratagem.planning._plan import FailureClass, StepStatus
from stratagem.planning._store import (
    CompensationRecord,
    CompensationStatus,
    MapRecord,
    StepResult,
)


def expanded(
    state: _RunState[Any], step_id: str, values: list[Any], digest: str, recorded: bool
) -> _Items:
    """Map step ``step_id``'s list was evaluated: its items (the decision journaled unless
    ``recorded`` already, before any item starts)."""
    items = state.expansions.get(step_id)
    if items is None:
        items = state.expansions[step_id] = _Items(values)
    else:  # a resumed run: the items' results were loaded first
        items.values = values
    if not recorded:
        plan = state.plan
        state.record(MapRecord(plan.id, plan.revision, step_id, len(values), digest))
    state.observer.emit(
        step_id,
        StepStatus.RUNNING,
        state.attempts.get(step_id, 1),
        message=f"map over {len(values)} item(s)",
    )
    return items


def item_started(state: _RunState[Any], step_id: str, index: int, attempt: int) -> None:
    """Attempt ``attempt`` of item ``index`` of map ``step_id`` starts."""
    state.expansions[step_id].attempts[index] = attempt


def item_retrying(
    state: _RunState[Any],
    step_id: str,
    index: int,
    attempt: int,
    failure_class: FailureClass,
    message: str,
) -> None:
    """An attempt of an item failed and is retried."""
    plan = state.plan
    state.record(
        StepResult(
            plan.id,
            plan.revision,
            expansion_key(step_id, index),
            attempt,
            StepStatus.RETRYING,
            failure_class=failure_class,
            message=message,
        )
    )


def item_succeeded(
    state: _RunState[Any],
    step_id: str,
    index: int,
    output: Any,
    attempt: int,
    output_json: str | None,
) -> None:
    """Item ``index`` of map ``step_id`` succeeded (and is to be compensated if the map is)."""
    state.expansions[step_id].outputs[index] = output
    key = expansion_key(step_id, index)
    compensated = state.steps[step_id].compensate is not None
    if state.journal is not None and not state.interrupted:
        plan = state.plan
        result = StepResult(plan.id, plan.revision, key, attempt, StepStatus.SUCCEEDED, output_json)
        if not compensated:
            state.journal.add(result)
        else:
            state.journal.add(
                result,
                CompensationRecord(plan.id, plan.revision, key, CompensationStatus.NEEDED),
            )
    if compensated:
        state.compensable.append(key)
        state.compensation[key] = CompensationStatus.NEEDED


def item_ended(
    state: _RunState[Any],
    step_id: str,
    index: int,
    attempt: int,
    status: StepStatus,
    failure_class: FailureClass,
    message: str,
) -> None:
    """Item ``index`` of map ``step_id`` ended ``failed`` or ``cancelled`` (recorded only:
    the map step's own outcome is settled by the scheduler)."""
    plan = state.plan
    state.record(
        StepResult(
            plan.id,
            plan.revision,
            expansion_key(step_id, index),
            attempt,
            status,
            failure_class=failure_class,
            message=message,
        )
    )


def load_item(state: _RunState[Any], step_id: str, index: int, output: Any, attempt: int) -> None:
    """A resumed run finds item ``index`` of map ``step_id`` succeeded."""
    items = state.expansions.get(step_id)
    if items is None:
        items = state.expansions[step_id] = _Items([])
    items.outputs[index] = output
    items.attempts[index] = attempt


def load_item_attempt(state: _RunState[Any], step_id: str, index: int, attempt: int) -> None:
    """A resumed run finds item ``index`` of map ``step_id`` at attempt ``attempt``."""
    items = state.expansions.get(step_id)
    if items is None:
        items = state.expansions[step_id] = _Items([])
    items.attempts[index] = attempt
