"""One row format for a plan's journal, whichever store keeps it (SQLite or PostgreSQL).

A record is six columns: ``(kind, step_id, attempt, status, output, data)``; ``kind`` numbers the
record type and ``data`` carries what the other columns do not, as compact JSON. A journal reads the
same whichever backend wrote it.

The two records every step writes keep their time as whole microseconds: an intent's ``data`` is
``"<cost>,<at>"``, a success's ``"<at>"``. Formatting an integer costs a fraction of a float's
shortest text (``repr``), which was most of a checkpointed step's record cost; the time is read back
as seconds (``_seconds``), and rows written before (seconds with a point) read the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from stratagem.planning._errors import StoreError
from stratagem.planning._plan import FailureClass, PlanStatus, StepStatus
from stratagem.planning._store._history import trace_id_of
from stratagem.planning._store._state import (
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    ConditionRecord,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    IterationRecord,
    MapRecord,
    PlanStatusRecord,
    Record,
    StepIntent,
    StepResult,
)

__all__ = ["IndexRow", "Row", "compact_json", "decode_record", "encode_record", "index_row"]

# Record kinds as stored in events.kind: never renumber, only add.
_PLAN_STATUS: Final = 1
_STEP_INTENT: Final = 2
_STEP_RESULT: Final = 3
_GATE: Final = 4
_COMPENSATION: Final = 5
_CONTROL: Final = 6
_BUDGET: Final = 7
_CONDITION: Final = 8
_MAP: Final = 9
_ITERATION: Final = 10

Row = tuple[int, str | None, int | None, str | None, str | None, str | None]


def encode_record(record: Record) -> Row:
    """A record as (kind, step_id, attempt, status, output, data) columns."""
    match record:
        case PlanStatusRecord():
            return (
                _PLAN_STATUS,
                None,
                None,
                record.status.value,
                None,
                # A traced run's context rides in the same JSON array (no schema change).
                compact_json(
                    [record.message, record.at, record.trace_context]
                    if record.trace_context
                    else [record.message, record.at]
                ),
            )
        case StepIntent():
            # "<cost>,<at>" (cost "" when none): one short text, no JSON to build per step.
            cost = "" if record.cost is None else repr(record.cost)
            return (
                _STEP_INTENT,
                record.step_id,
                record.attempt,
                None,
                None,
                f"{cost},{round(record.at * 1_000_000)}",
            )
        case StepResult():
            data = (
                str(round(record.at * 1_000_000))
                if record.failure_class is None
                else compact_json([record.failure_class.value, record.message, record.at])
            )
            return (
                _STEP_RESULT,
                record.step_id,
                record.attempt,
                record.status.value,
                record.output_json,
                data,
            )
        case GateRecord():
            fields: list[Any] = [
                record.kind.value,
                record.prompt,
                record.approver,
                record.rationale,
                record.at,
            ]
            more = _gate_extras(record)
            if more:  # what a gate asks, its deadline and deciders ride in the same array
                fields.append(more)
            data = compact_json(fields)
            return _GATE, record.gate_id, None, record.decision.value, record.output_json, data
        case CompensationRecord():
            return (
                _COMPENSATION,
                record.step_id,
                record.attempt,
                record.status.value,
                None,
                record.message or None,
            )
        case ControlRecord():
            return _CONTROL, None, None, record.action, None, compact_json([record.at])
        case BudgetRecord():
            return _BUDGET, None, record.calls, None, None, repr(record.cost)
        case ConditionRecord():
            status = "held" if record.holds else "not_held"
            return _CONDITION, record.step_id, None, status, record.value_json, None
        case MapRecord():
            return _MAP, record.step_id, record.items, None, None, record.digest
        case IterationRecord():
            return (
                _ITERATION,
                record.step_id,
                record.iteration,
                record.outcome,
                record.value_json,
                compact_json([record.at]),
            )
        case _:
            assert_never(record)


def decode_record(plan_id: str, revision: int, row: Sequence[Any]) -> Record:
    kind, step_id, attempt, status, output, data = row
    match kind:
        case 1:
            message, at, *context = json.loads(data)
            return PlanStatusRecord(
                plan_id, revision, PlanStatus(status), message, at, context[0] if context else ""
            )
        case 2:
            # Schema 4 writes "<cost>,<at>" (the time in whole microseconds; in seconds with a
            # point in rows written before); earlier ones the cost alone, or nothing.
            cost, _, at = ("" if data is None else data).partition(",")
            return StepIntent(
                plan_id,
                revision,
                step_id,
                attempt,
                float(cost) if cost else None,
                _seconds(at) if at else 0.0,
            )
        case 3:
            failure_class, message, at = None, "", 0.0
            if data is not None and data.startswith("["):
                failure_class, message, *when = json.loads(data)
                at = when[0] if when else 0.0
            elif data is not None:
                at = _seconds(data)
            return StepResult(
                plan_id,
                revision,
                step_id,
                attempt,
                StepStatus(status),
                output,
                None if failure_class is None else FailureClass(failure_class),
                message,
                at,
            )
        case 4:
            gate_kind, prompt, approver, rationale, at, *rest = json.loads(data)
            more: dict[str, Any] = rest[0] if rest else {}
            return GateRecord(
                plan_id,
                revision,
                step_id,
                GateDecision(status),
                GateKind(gate_kind),
                prompt,
                approver,
                rationale,
                output,
                at,
                value_json=more.get("value"),
                arguments_json=more.get("arguments"),
                deadline=more.get("deadline"),
                escalate_at=more.get("escalate_at"),
                deciders=tuple(more.get("deciders", ())),
                escalated=bool(more.get("escalated", False)),
            )
        case 5:
            return CompensationRecord(
                plan_id, revision, step_id, CompensationStatus(status), attempt, data or ""
            )
        case 6:
            (at,) = json.loads(data)
            return ControlRecord(plan_id, revision, "cancel", at)
        case 7:
            return BudgetRecord(plan_id, revision, attempt, float(data))
        case 8:
            return ConditionRecord(plan_id, revision, step_id, status == "held", output or "null")
        case 9:
            return MapRecord(plan_id, revision, step_id, attempt, data)
        case 10:
            (at,) = json.loads(data)
            return IterationRecord(
                plan_id, revision, step_id, attempt, status, output or "null", at
            )
        case _:
            raise StoreError(f"unknown record kind {kind!r} in the journal of plan {plan_id!r}")


def _seconds(text: str) -> float:
    """A time as whole microseconds, or as seconds with a point (rows written before)."""
    return int(text) / 1_000_000 if text.isdigit() else float(text)


def _gate_extras(record: GateRecord) -> dict[str, Any]:
    """A gate record's fields beyond the first five, only those set (a plain gate adds none)."""
    more: dict[str, Any] = {}
    if record.value_json is not None:
        more["value"] = record.value_json
    if record.arguments_json is not None:
        more["arguments"] = record.arguments_json
    if record.deadline is not None:
        more["deadline"] = record.deadline
    if record.escalate_at is not None:
        more["escalate_at"] = record.escalate_at
    if record.deciders:
        more["deciders"] = list(record.deciders)
    if record.escalated:
        more["escalated"] = True
    return more


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What the history keeps about one plan, as ``index_row`` derives it from the journal."""

    plan_id: str
    revision: int
    status: str
    goal: str
    trace_id: str
    message: str
    created: float
    updated: float


def index_row(
    plan_id: str,
    revision: int,
    plan_json: str,
    created: float,
    updated: float,
    records: Iterable[Record],
) -> IndexRow:
    """The index row of a plan from its newest revision's journal (migrations fill the index of
    plans stored before it existed with this). ``records`` are the plan's status records, every
    revision's, oldest first; the trace is the first traced run's, the status and message the
    newest revision's last."""
    status, message, trace_id = PlanStatus.PENDING.value, "", ""
    for record in records:
        if not isinstance(record, PlanStatusRecord):
            continue
        if not trace_id and record.trace_context:
            trace_id = trace_id_of(record.trace_context)
        if record.revision == revision:
            status, message = record.status.value, record.message
    try:
        goal = json.loads(plan_json).get("goal", "")
    except (ValueError, AttributeError, RecursionError):
        goal = ""
    return IndexRow(
        plan_id=plan_id,
        revision=revision,
        status=status,
        goal=goal if isinstance(goal, str) else "",
        trace_id=trace_id,
        message=message,
        created=created,
        updated=updated,
    )
