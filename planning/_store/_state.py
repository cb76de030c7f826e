"""Durable plan state: the ``StateStore`` protocol and the in-memory store; the records
(``_records``) and the fold (``_fold``) re-exported.

A store keeps **deltas**, never whole-state snapshots: each plan revision is written once (its
JSON), and every later change is one small record appended to the plan's journal. The state of a
plan (``PlanState``) is the fold of its journal, in order (``fold``), so the store grows linearly
with the number of steps run.

Beside the journals a store keeps each plan's revision history (``RevisionRecord``, written with
the new revision's plan row and its carried-over results in one transaction) and the engine's
circuit breakers (``BreakerState`` per tool).

The engine groups the records of one scheduler tick into one ``StateStore.commit`` call, which a
store must apply atomically (all or nothing).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from stratagem.planning._errors import StoreError
from stratagem.planning._plan import Plan, PlanStatus
from stratagem.planning._revisions import RevisionRecord
from stratagem.planning._store._fold import (
    TIMEOUT_APPROVER,
    CompensationState,
    GateState,
    PlanState,
    StepState,
    fold,
)
from stratagem.planning._store._history import HistoryQuery, PlanSummary, matches, trace_id_of
from stratagem.planning._store._records import (
    BudgetRecord,
    CompensationRecord,
    CompensationStatus,
    ConditionRecord,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    IterationOutcome,
    IterationRecord,
    MapRecord,
    PlanStatusRecord,
    Record,
    StepIntent,
    StepResult,
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
    "InMemoryStateStore",
    "IterationOutcome",
    "IterationRecord",
    "MapRecord",
    "PlanState",
    "PlanStatusRecord",
    "Record",
    "StateStore",
    "StepIntent",
    "StepResult",
    "StepState",
    "StoreStats",
    "fold",
]

P = TypeVar("P", bound=Plan)


@dataclass(frozen=True, slots=True)
class StoreStats:
    """How much a store holds.

    Attributes:
        plans: Plan revisions stored.
        records: Journal records stored.
        bytes: Bytes used (for SQLite: the database pages in use, WAL excluded).
    """

    plans: int
    records: int
    bytes: int


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A tool's circuit breaker, as the store keeps it.

    Attributes:
        tool: The tool's name.
        failures: Consecutive failed attempts (transient or timeout) since the last success.
        opened_at: When the breaker last opened (``time.time()`` of the engine's clock), or
            ``None`` when it never opened since the last success.
    """

    tool: str
    failures: int = 0
    opened_at: float | None = None


class StateStore(Protocol):
    """Where an engine keeps plans and their journals (e.g. ``SqliteStateStore``).

    Every method may be called from the event loop; a store does blocking work in a thread of its
    own, never on the loop. ``commit`` is atomic and durable on return (see the implementation for
    what "durable" means against OS crashes), and commits are applied in call order.
    """

    async def save_plan(self, plan: Plan) -> bool:
        """Store a plan revision (its JSON, once) with status ``pending``.

        Returns:
            True when stored now; False when this plan id and revision were already stored.
        """
        ...

    async def commit(self, records: Sequence[Record]) -> None:
        """Append ``records`` to their plans' journals in one transaction.

        Raises:
            StoreError: When the write fails; nothing of ``records`` is stored then.
        """
        ...

    async def load(self, plan_id: str, revision: int | None = None) -> PlanState | None:
        """The state of the newest stored revision of ``plan_id`` (or of ``revision``), or
        ``None`` when unknown."""
        ...

    async def journal(self, plan_id: str, revision: int | None = None) -> list[Record]:
        """The journal of one revision (the newest by default), oldest first; ``[]`` if unknown."""
        ...

    async def save_revision(
        self, plan: Plan, record: RevisionRecord, records: Sequence[Record]
    ) -> None:
        """Store a new revision in one transaction: its plan, its history entry and ``records``.

        ``records`` are the new revision's first journal records (the carried-over results).

        Raises:
            StoreError: When the revision exists already or the write fails (nothing is stored).
        """
        ...

    async def revisions(self, plan_id: str) -> list[RevisionRecord]:
        """The plan's revision history, oldest first (the first revision included)."""
        ...

    async def breakers(self) -> list[BreakerState]:
        """Every stored circuit breaker."""
        ...

    async def save_breaker(self, state: BreakerState) -> None:
        """Store (replace) one tool's circuit breaker."""
        ...

    async def unfinished(self) -> list[str]:
        """The ids of the plans whose newest revision's last status is not final, oldest first."""
        ...

    async def prune(self, *, before: float | None = None, keep_last: int | None = None) -> int:
        """Delete finished plans (every revision, journals, history); unfinished plans are kept.

        A plan is finished when its newest revision's status is final.

        Args:
            before: Only plans whose last change is older than this ``time.time()`` value.
            keep_last: Keep this many of the most recently changed finished plans.

        Returns:
            How many plan revisions were deleted.
        """
        ...

    async def history(self, query: HistoryQuery) -> list[PlanSummary]:
        """The plans ``query`` asks for, newest first: at most ``query.limit`` of them.

        Raises:
            StoreError: When the store cannot be read.
        """
        ...

    async def stats(self) -> StoreStats:
        """How many plans and records the store holds and the bytes it uses."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources; further calls fail."""
        ...


@dataclass(slots=True)
class _MemoryPlan:
    plan_json: str
    status: PlanStatus = PlanStatus.PENDING
    updated: float = field(default_factory=time.time)
    records: list[Record] = field(default_factory=list)


@dataclass(slots=True)
class _MemoryIndex:
    """A plan's entry in the in-memory history (the durable stores' ``plan_index`` row)."""

    cursor: int
    revision: int
    goal: str
    created: float
    updated: float
    status: PlanStatus = PlanStatus.PENDING
    trace_id: str = ""
    message: str = ""


class InMemoryStateStore:
    """A ``StateStore`` in a dict: for tests and for runs that need control but not durability.

    Attributes:
        commits: How many ``commit`` calls were applied (for tests).
    """

    def __init__(self) -> None:
        self._plans: dict[tuple[str, int], _MemoryPlan] = {}
        self._revisions: dict[str, list[RevisionRecord]] = {}
        self._breakers: dict[str, BreakerState] = {}
        self._index: dict[str, _MemoryIndex] = {}
        self.commits = 0

    async def save_plan(self, plan: Plan) -> bool:
        """See ``StateStore.save_plan``."""
        key = (plan.id, plan.revision)
        if key in self._plans:
            return False
        self._plans[key] = _MemoryPlan(plan.model_dump_json())
        self._revisions.setdefault(plan.id, []).append(RevisionRecord(plan.id, plan.revision, None))
        self._indexed(plan)
        return True

    def _indexed(self, plan: Plan) -> None:
        now = time.time()
        entry = self._index.get(plan.id)
        if entry is None:
            cursor = max((e.cursor for e in self._index.values()), default=0) + 1
            self._index[plan.id] = _MemoryIndex(cursor, plan.revision, plan.goal, now, now)
        elif plan.revision > entry.revision:
            entry.revision, entry.goal, entry.updated = plan.revision, plan.goal, now
            entry.status, entry.message = PlanStatus.PENDING, ""

    async def save_revision(
        self, plan: Plan, record: RevisionRecord, records: Sequence[Record]
    ) -> None:
        """See ``StateStore.save_revision``."""
        key = (plan.id, plan.revision)
        if key in self._plans:
            raise StoreError(f"plan {plan.id!r} revision {plan.revision} is already stored")
        if any((r.plan_id, r.revision) != key for r in records):
            raise StoreError("carried records must belong to the new revision")
        self._plans[key] = _MemoryPlan(plan.model_dump_json(), records=list(records))
        self._revisions.setdefault(plan.id, []).append(record)
        self._indexed(plan)
        self.commits += 1

    async def revisions(self, plan_id: str) -> list[RevisionRecord]:
        """See ``StateStore.revisions``."""
        return sorted(self._revisions.get(plan_id, []), key=lambda r: r.revision)

    async def journal(self, plan_id: str, revision: int | None = None) -> list[Record]:
        """See ``StateStore.journal``."""
        if revision is None:
            revision = max((rev for (pid, rev) in self._plans if pid == plan_id), default=0)
        stored = self._plans.get((plan_id, revision))
        return [] if stored is None else list(stored.records)

    async def breakers(self) -> list[BreakerState]:
        """See ``StateStore.breakers``."""
        return list(self._breakers.values())

    async def save_breaker(self, state: BreakerState) -> None:
        """See ``StateStore.save_breaker``."""
        self._breakers[state.tool] = state

    async def commit(self, records: Sequence[Record]) -> None:
        """See ``StateStore.commit``."""
        missing = {
            (r.plan_id, r.revision) for r in records if (r.plan_id, r.revision) not in self._plans
        }
        if missing:
            raise StoreError(f"records for plans never saved: {sorted(missing)}")
        now = time.time()
        for record in records:
            stored = self._plans[(record.plan_id, record.revision)]
            stored.records.append(record)
            stored.updated = now
            if isinstance(record, PlanStatusRecord):
                stored.status = record.status
                entry = self._index.get(record.plan_id)
                if entry is not None and entry.revision == record.revision:
                    entry.status, entry.message, entry.updated = (
                        record.status,
                        record.message,
                        record.at,
                    )
                    if not entry.trace_id and record.trace_context:
                        entry.trace_id = trace_id_of(record.trace_context)
        self.commits += 1

    async def load(self, plan_id: str, revision: int | None = None) -> PlanState | None:
        """See ``StateStore.load``."""
        revisions = [rev for (pid, rev) in self._plans if pid == plan_id]
        if revision is None:
            revision = max(revisions, default=None)
        if revision not in revisions:
            return None
        stored = self._plans[(plan_id, revision)]
        return fold(plan_id, revision, stored.plan_json, stored.records)

    def _newest(self) -> dict[str, tuple[int, _MemoryPlan]]:
        newest: dict[str, tuple[int, _MemoryPlan]] = {}
        for (plan_id, revision), stored in self._plans.items():
            if plan_id not in newest or revision > newest[plan_id][0]:
                newest[plan_id] = (revision, stored)
        return newest

    async def unfinished(self) -> list[str]:
        """See ``StateStore.unfinished``."""
        return [
            plan_id for plan_id, (_, stored) in self._newest().items() if not stored.status.is_final
        ]

    async def prune(self, *, before: float | None = None, keep_last: int | None = None) -> int:
        """See ``StateStore.prune``."""
        finished = sorted(
            (stored.updated, plan_id)
            for plan_id, (_, stored) in self._newest().items()
            if stored.status.is_final
        )
        if keep_last:
            finished = finished[: max(0, len(finished) - keep_last)]
        doomed = {plan_id for updated, plan_id in finished if before is None or updated < before}
        keys = [key for key in self._plans if key[0] in doomed]
        for key in keys:
            del self._plans[key]
        for plan_id in doomed:
            self._revisions.pop(plan_id, None)
            self._index.pop(plan_id, None)
        return len(keys)

    async def history(self, query: HistoryQuery) -> list[PlanSummary]:
        """See ``StateStore.history``."""
        found: list[PlanSummary] = []
        order = 1 if query.oldest_first else -1
        for plan_id, entry in sorted(self._index.items(), key=lambda item: order * item[1].cursor):
            summary = PlanSummary(
                plan_id=plan_id,
                revision=entry.revision,
                status=entry.status,
                goal=entry.goal,
                created=entry.created,
                updated=entry.updated,
                trace_id=entry.trace_id,
                message=entry.message,
                cursor=entry.cursor,
            )
            texts: list[str] = []
            if query.text:
                for (pid, _), stored in self._plans.items():
                    if pid == plan_id:
                        texts.append(stored.plan_json)
                        texts.extend(repr(record) for record in stored.records)
            if matches(summary, query, texts):
                found.append(summary)
                if len(found) >= query.limit:
                    break
        return found

    async def stats(self) -> StoreStats:
        """See ``StateStore.stats``; ``bytes`` counts the stored JSON and record reprs."""
        records = sum(len(stored.records) for stored in self._plans.values())
        size = sum(
            len(stored.plan_json) + sum(len(repr(r)) for r in stored.records)
            for stored in self._plans.values()
        )
        return StoreStats(plans=len(self._plans), records=records, bytes=size)

    async def aclose(self) -> None:
        """Nothing to release."""
