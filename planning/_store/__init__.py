"""Durable plan state: the journal records, the ``StateStore`` protocol and its stores.

``_state`` holds the records, the fold and the ``StateStore`` protocol with its in-memory store;
``_sqlite`` and ``_postgres`` the two durable stores (the PostgreSQL one is imported on first use:
the ``postgres`` extra); ``_rows`` the one row format of a journal record in both; ``_history``
the history query (``HistoryQuery``, ``PlanSummary``) and the SQL both build for it.
"""

from stratagem.planning._store._history import HistoryQuery, PlanSummary
from stratagem.planning._store._state import (
    BreakerState,
    BudgetRecord,
    CompensationRecord,
    CompensationState,
    CompensationStatus,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
    InMemoryStateStore,
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
    "BreakerState",
    "BudgetRecord",
    "CompensationRecord",
    "CompensationState",
    "CompensationStatus",
    "ControlRecord",
    "GateDecision",
    "GateKind",
    "GateRecord",
    "GateState",
    "HistoryQuery",
    "InMemoryStateStore",
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
