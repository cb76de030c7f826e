"""Durable plan state: the journal records, the ``StateStore`` protocol and its stores.

``_records`` holds the journal's records, ``_fold`` the fold of a journal into a plan's state,
``_state`` the ``StateStore`` protocol with its in-memory store (and re-exports the other two);
``_sqlite`` and ``_postgres`` the two durable stores (the PostgreSQL one, with its schema's
migrations in ``_postgres_schema``, is imported on first use: the ``postgres`` extra); ``_rows`` the
one row format of a journal record in both; ``_history`` the history query (``HistoryQuery``,
``PlanSummary``) and the SQL both build for it.
"""

from stratagem.planning._store._history import HistoryQuery, PlanSummary
from stratagem.planning._store._state import (
    TIMEOUT_APPROVER,
    BreakerState,
    BudgetRecord,
    CompensationRecord,
    CompensationState,
    CompensationStatus,
    ConditionRecord,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
    InMemoryStateStore,
    IterationRecord,
    MapRecord,
    PlanState,
    PlanStatusRecord,
    Record,
    StateStore,
    StepIntent,
    StepResult,
    StepState,
    StoreStats,
    fold,
)

__all__ = [
    "TIMEOUT_APPROVER",
    "BreakerState",
    "BudgetRecord",
    "CompensationRecord",
    "CompensationState",
    "CompensationStatus",
    "ConditionRecord",
    "ControlRecord",
    "GateDecision",
    "GateKind",
    "GateRecord",
    "GateState",
    "HistoryQuery",
    "InMemoryStateStore",
    "IterationRecord",
    "MapRecord",
    "PlanState",
    "PlanStatusRecord",
    "PlanSummary",
    "Record",
    "StateStore",
    "StepIntent",
    "StepResult",
    "StepState",
    "StoreStats",
    "fold",
]
