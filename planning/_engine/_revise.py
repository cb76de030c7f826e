"""Making a plan's next revision: the new plan, its carried results, its history entry."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stratagem.planning._dag import structural_problems
from stratagem.planning._errors import PlanValidationError
from stratagem.planning._kinds import runs_items
from stratagem.planning._plan import Plan, Step, StepStatus
from stratagem.planning._revisions import Revision, RevisionRecord, diff_plans, unchanged_steps
from stratagem.planning._store import (
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    MapRecord,
    PlanState,
    Record,
    StateStore,
    StepResult,
    fold,
)


async def make_revision(
    old: Plan,
    new: Plan,
    outputs: dict[str, Any],
    attempts: dict[str, int],
    compensations: dict[str, CompensationStatus],
    rationale: str,
    author: str,
    *,
    spent: tuple[int, float] = (0, 0.0),
    items: Mapping[str, Any] | None = None,
    maps: Mapping[str, MapRecord] | None = None,
    store: StateStore | None,
    clock: Callable[[], float],
    more: Sequence[Record] = (),
) -> tuple[Revision, PlanState]:
    """Make (and store, with a store) the revision after ``old``; its state holds the carried
    results and what earlier revisions spent of the plan's budget (and ``more``: first records
    of the new revision, e.g. an approval it carries).

    ``items`` (map item key -> output, for the items that succeeded) and ``maps`` (the maps'
    recorded lists) let an unchanged map that had not finished carry its succeeded items.

    Raises:
        PlanValidationError: When the new steps do not form a DAG.
        StoreError: When the store fails.
    """
    steps = [
        step
        if step.status is StepStatus.PENDING
        else step.model_copy(update={"status": StepStatus.PENDING})
        for step in new.steps
    ]
    plan = new.model_copy(update={"id": old.id, "revision": old.revision + 1, "steps": steps})
    problems = structural_problems(plan.steps)
    if problems:
        raise PlanValidationError(problems)
    same = unchanged_steps(old, plan)
    carried = [step.id for step in plan.steps if step.id in same and step.id in outputs]
    records: list[Record] = []
    if spent != (0, 0.0):
        records.append(BudgetRecord(plan.id, plan.revision, spent[0], spent[1]))
    message = f"carried over from revision {old.revision}"
    for step in plan.steps:
        if step.id not in carried:
            continue
        records.extend(
            _carried_result(plan, step, step.id, outputs[step.id], attempts, compensations, message)
        )
    for step in plan.steps:
        record_of_map = (maps or {}).get(step.id)
        if (
            not runs_items(step)
            or step.id not in same
            or step.id in outputs
            or record_of_map is None
        ):
            continue
        records.append(
            MapRecord(plan.id, plan.revision, step.id, record_of_map.items, record_of_map.digest)
        )
        prefix = f"{step.id}."
        for key, output in (items or {}).items():
            if not key.startswith(prefix):
                continue
            carried.append(key)
            records.extend(
                _carried_result(plan, step, key, output, attempts, compensations, message)
            )
    records.extend(more)
    record = RevisionRecord(
        plan.id,
        plan.revision,
        old.revision,
        rationale,
        author,
        diff_plans(old, plan),
        carried,
        clock(),
    )
    if store is not None:
        await store.save_revision(plan, record, records)
    state = fold(plan.id, plan.revision, plan.model_dump_json(), records)
    return Revision(plan, record), state


def _carried_result(
    plan: Plan,
    step: Step,
    key: str,
    output: Any,
    attempts: dict[str, int],
    compensations: dict[str, CompensationStatus],
    message: str,
) -> list[Record]:
    """The records of a result carried into ``plan`` (a step's, or a map item's ``key``): its
    success and, when ``step`` compensates and its undo is still owed, the compensation owed."""
    records: list[Record] = [
        StepResult(
            plan.id,
            plan.revision,
            key,
            attempts.get(key, 1),
            StepStatus.SUCCEEDED,
            json.dumps(output),
            message=message,
        )
    ]
    if step.compensate is not None and compensations.get(key) in (
        None,
        CompensationStatus.NEEDED,
        CompensationStatus.RUNNING,
    ):
        records.append(CompensationRecord(plan.id, plan.revision, key, CompensationStatus.NEEDED))
    return records
