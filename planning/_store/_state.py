"""Durable plan state: the journal records, the ``StateStore`` protocol and an in-memory store.

A store keeps **deltas**, never whole-state snapshots: each plan revision is written once (its
JSON), and every later change is one small record appended to the plan's journal. The state of a
plan (``PlanState``) is the fold of its journal, in order (``fold``), so the store grows linearly
with the number of steps run.

Records (all frozen dataclasses; ``Record`` is their union):

- ``PlanStatusRecord``: the plan's status changed (``running``, ``blocked``, ``paused``,
  ``compensating``, a final status).
- ``StepIntent``: an attempt of a step is about to start (its idempotency key is
  ``f"{plan_id}@{revision}:{step_id}"``). Written and committed *before* the tool call or dispatch.
- ``StepResult``: an attempt ended: ``succeeded`` (output JSON), ``retrying`` (a retried failure),
  or the step's final ``failed``/``cancelled`` (failure class + message).
- ``GateRecord``: a gate opened (a gate step, or a reconcile gate naming a step that was in flight
  when the plan stopped), or was approved or rejected (approver, rationale, revision).
- ``CompensationRecord``: the compensation journal: ``needed`` (committed with the step's success),
  ``running`` (an attempt's intent), ``compensated`` or ``failed``.
- ``ControlRecord``: a ``cancel`` was requested (so a resume honours it).

Beside the journals a store keeps each plan's revision history (``RevisionRecord``, written with
the new revision's plan row and its carried-over results in one transaction) and the engine's
circuit breakers (``BreakerState`` per tool).

The engine groups the records of one scheduler tick into one ``StateStore.commit`` call, which a
store must apply atomically (all or nothing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._errors import StoreError
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, StepStatus
from stratagem.planning._revisions import RevisionRecord
from stratagem.planning._store._history import HistoryQuery, PlanSummary, matches, trace_id_of

__all__ = [
    "BreakerState",
    "CompensationRecord",
    "CompensationState",
    "CompensationStatus",
    "ControlRecord",
    "GateDecision",
    "GateKind",
    "GateRecord",
    "GateState",
    "InMemoryStateStore",
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


class GateKind(StrEnum):
    """What a gate is for."""

    GATE = "gate"
    """A gate step of the plan."""
    RECONCILE = "reconcile"
    """A step was in flight when the plan stopped and its tool is not idempotent."""
    POLICY = "policy"
    """A step with ``on_policy_failure="gate"`` failed a policy check."""


class GateDecision(StrEnum):
    """Where a gate is."""

    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"


class CompensationStatus(StrEnum):
    """Where one step's compensation is."""

    NEEDED = "needed"
    RUNNING = "running"
    COMPENSATED = "compensated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class PlanStatusRecord:
    """The plan's status changed.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        status: The new status.
        message: Why, in one line ("" when there is nothing to add).
        at: Wall-clock time (``time.time()``).
        trace_context: For ``running``: the W3C ``traceparent`` of the run's plan span ("" when
            the run was not traced), so a resumed run can link to the run it continues.
    """

    plan_id: str
    revision: int
    status: PlanStatus
    message: str = ""
    at: float = field(default_factory=time.time)
    trace_context: str = ""


@dataclass(frozen=True, slots=True)
class StepIntent:
    """An attempt of a step is about to start; committed before its side effect.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The step.
        attempt: The attempt number, from 1.
        cost: The cost units reserved for the attempt, for a plan with a budget (``None``
            otherwise). Every intent reserves one tool call.
        at: Wall-clock time (``time.time()``); 0 in records stored before it was kept.
    """

    plan_id: str
    revision: int
    step_id: str
    attempt: int
    cost: float | None = None
    at: float = field(default_factory=time.time, compare=False)

    @property
    def key(self) -> str:
        """The step's idempotency key, ``f"{plan_id}@{revision}:{step_id}"``."""
        return step_run_id(self.plan_id, self.revision, self.step_id)


@dataclass(frozen=True, slots=True)
class StepResult:
    """An attempt of a step ended.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The step.
        attempt: The attempt that ended.
        status: ``succeeded``, ``retrying`` (this attempt failed and another follows), ``failed``
            or ``cancelled`` (final).
        output_json: The output as JSON, for ``succeeded``.
        failure_class: The failure's class, for the other statuses.
        message: A one-line description of the failure.
        at: Wall-clock time (``time.time()``); 0 in records stored before it was kept.
    """

    plan_id: str
    revision: int
    step_id: str
    attempt: int
    status: StepStatus
    output_json: str | None = None
    failure_class: FailureClass | None = None
    message: str = ""
    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True, slots=True)
class GateRecord:
    """A gate opened or was decided.

    Attributes:
        plan_id: The plan.
        revision: The revision the gate belongs to (a decision: the one it was given for).
        gate_id: A gate step's id, or the id of the step a reconcile gate names.
        decision: ``open``, ``approved`` or ``rejected``.
        kind: A gate step or a reconcile gate.
        prompt: What the approver is asked (on ``open``).
        approver: Who decided.
        rationale: Why.
        output_json: For an approved reconcile gate: the output to record for the step instead of
            re-running it (``None``: re-run it).
        at: Wall-clock time (``time.time()``).
    """

    plan_id: str
    revision: int
    gate_id: str
    decision: GateDecision
    kind: GateKind = GateKind.GATE
    prompt: str = ""
    approver: str = ""
    rationale: str = ""
    output_json: str | None = None
    at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class CompensationRecord:
    """An entry of the compensation journal.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        step_id: The compensated step.
        status: ``needed`` (written with the step's success), ``running`` (an attempt's intent),
            ``compensated`` or ``failed``.
        attempt: The compensation attempt (0 for ``needed``).
        message: Why it failed, for ``failed``.
    """

    plan_id: str
    revision: int
    step_id: str
    status: CompensationStatus
    attempt: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A control request that a later resume must honour.

    Attributes:
        plan_id: The plan.
        revision: Its revision.
        action: ``cancel``.
        at: Wall-clock time (``time.time()``).
    """

    plan_id: str
    revision: int
    action: Literal["cancel"] = "cancel"
    at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """What earlier revisions of the plan spent, carried into a new revision's budget account.

    A budget belongs to the plan, not to one revision: without this record a replan would start
    spending from zero again.

    Attributes:
        plan_id: The plan.
        revision: The new revision.
        calls: Tool calls reserved by earlier revisions.
        cost: Cost units reserved by earlier revisions.
    """

    plan_id: str
    revision: int
    calls: int
    cost: float


Record = (
    PlanStatusRecord
    | StepIntent
    | StepResult
    | GateRecord
    | CompensationRecord
    | ControlRecord
    | BudgetRecord
)
"""Any journal record."""


@dataclass(slots=True)
class StepState:
    """A step's last recorded state.

    Attributes:
        status: ``running`` when an intent has no result yet (the step was in flight), otherwise
            the last result's status.
        attempt: The last attempt recorded.
        output: The output, when the step succeeded.
        failure_class: The last failure's class.
        message: The last failure's message.
        started: When its first attempt started (``None``: unknown, or it never ran).
        ended: When its last recorded attempt ended (``None``: unknown, or not ended).
    """

    status: StepStatus
    attempt: int
    output: dict[str, Any] | None = None
    failure_class: FailureClass | None = None
    message: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def in_flight(self) -> bool:
        """Whether an attempt started and has no recorded result."""
        return self.status is StepStatus.RUNNING


@dataclass(slots=True)
class GateState:
    """A gate's recorded state.

    Attributes:
        gate_id: The gate's id.
        kind: A gate step or a reconcile gate.
        decision: ``open``, ``approved`` or ``rejected``.
        revision: The revision it was opened (or decided) for.
        prompt: What the approver is asked.
        approver: Who decided.
        rationale: Why.
        output: For an approved reconcile gate: the output to record instead of re-running.
    """

    gate_id: str
    kind: GateKind
    decision: GateDecision
    revision: int
    prompt: str = ""
    approver: str = ""
    rationale: str = ""
    output: dict[str, Any] | None = None


@dataclass(slots=True)
class CompensationState:
    """One step's compensation, as the journal has it.

    Attributes:
        step_id: The compensated step.
        status: Where it is.
        attempt: The last attempt (0 before the first).
        message: Why it failed.
    """

    step_id: str
    status: CompensationStatus
    attempt: int = 0
    message: str = ""


@dataclass(slots=True)
class PlanState:
    """A plan revision's state, rebuilt from its journal.

    Attributes:
        plan_id: The plan.
        revision: The revision (the newest stored).
        plan_json: The plan as written by ``StateStore.save_plan``.
        status: The last recorded plan status (``pending`` before the first).
        message: The last status record's message.
        steps: Step id -> last recorded state, for steps with any record.
        gates: Gate id -> state.
        compensations: The compensation journal, in the order the steps succeeded.
        cancel_requested: Whether a ``cancel`` was recorded.
        records: How many journal records were folded.
        started_at: When the revision first ran (the first ``running`` status), or ``None``.
        spent_calls: Tool calls reserved so far (one per intent).
        spent_cost: Cost units reserved so far.
        trace_contexts: The W3C ``traceparent`` of each traced run of the revision, oldest first
            (the first is the original run's; a resumed run links to it and to the last).
    """

    plan_id: str
    revision: int
    plan_json: str
    status: PlanStatus = PlanStatus.PENDING
    message: str = ""
    steps: dict[str, StepState] = field(default_factory=dict)
    gates: dict[str, GateState] = field(default_factory=dict)
    compensations: list[CompensationState] = field(default_factory=list)
    cancel_requested: bool = False
    records: int = 0
    started_at: float | None = None
    spent_calls: int = 0
    spent_cost: float = 0.0
    trace_contexts: list[str] = field(default_factory=list)

    @property
    def outputs(self) -> dict[str, Any]:
        """Step id -> output, for every step recorded as succeeded."""
        return {
            step_id: state.output
            for step_id, state in self.steps.items()
            if state.status is StepStatus.SUCCEEDED
        }

    def plan(self, plan_type: type[P]) -> P:
        """The stored plan as ``plan_type``; fields ``plan_type`` lacks are dropped.

        Args:
            plan_type: ``Plan`` or a subclass of it (a role's plan type).
        """
        data = json.loads(self.plan_json)
        known = plan_type.model_fields
        return plan_type.model_validate({k: v for k, v in data.items() if k in known})


def fold(plan_id: str, revision: int, plan_json: str, records: Iterable[Record]) -> PlanState:
    """Rebuild a revision's state from its journal, applying the records in order.

    Records of other plans or revisions are ignored.

    Args:
        plan_id: The plan.
        revision: The revision.
        plan_json: The revision's plan JSON.
        records: The journal, oldest first.
    """
    state = PlanState(plan_id, revision, plan_json)
    compensations: dict[str, CompensationState] = {}
    for record in records:
        if record.plan_id != plan_id or record.revision != revision:
            continue
        state.records += 1
        match record:
            case PlanStatusRecord():
                state.status = record.status
                state.message = record.message
                if state.started_at is None and record.status is PlanStatus.RUNNING:
                    state.started_at = record.at
                if record.trace_context and record.trace_context not in state.trace_contexts:
                    state.trace_contexts.append(record.trace_context)
            case StepIntent():
                earlier = state.steps.get(record.step_id)
                started = earlier.started if earlier is not None else None
                if started is None and record.at:
                    started = record.at
                state.steps[record.step_id] = StepState(
                    StepStatus.RUNNING, record.attempt, started=started
                )
                state.spent_calls += 1
                if record.cost is not None:
                    state.spent_cost += record.cost
            case BudgetRecord():
                state.spent_calls += record.calls
                state.spent_cost += record.cost
            case StepResult():
                output = None if record.output_json is None else json.loads(record.output_json)
                earlier = state.steps.get(record.step_id)
                state.steps[record.step_id] = StepState(
                    record.status,
                    record.attempt,
                    output,
                    record.failure_class,
                    record.message,
                    started=earlier.started if earlier is not None else None,
                    ended=record.at or None,
                )
            case GateRecord():
                previous = state.gates.get(record.gate_id)
                state.gates[record.gate_id] = GateState(
                    gate_id=record.gate_id,
                    kind=record.kind,
                    decision=record.decision,
                    revision=record.revision,
                    prompt=record.prompt or (previous.prompt if previous else ""),
                    approver=record.approver,
                    rationale=record.rationale,
                    output=None if record.output_json is None else json.loads(record.output_json),
                )
            case CompensationRecord():
                entry = compensations.get(record.step_id)
                if entry is None:
                    entry = CompensationState(record.step_id, record.status)
                    compensations[record.step_id] = entry
                    state.compensations.append(entry)
                entry.status = record.status
                entry.attempt = max(entry.attempt, record.attempt)
                entry.message = record.message
            case ControlRecord():
                state.cancel_requested = True
            case _:  # pragma: no cover - the union is closed
                raise StoreError(f"unknown record {record!r}")
    return state


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

    async def load(self, plan_id: str) -> PlanState | None:
        """The state of the newest stored revision of ``plan_id``, or ``None`` when unknown."""
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

    async def load(self, plan_id: str) -> PlanState | None:
        """See ``StateStore.load``."""
        revisions = [rev for (pid, rev) in self._plans if pid == plan_id]
        if not revisions:
            return None
        revision = max(revisions)
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
        for plan_id, entry in sorted(self._index.items(), key=lambda item: -item[1].cursor):
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
