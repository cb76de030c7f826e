"""An agent's history: its plans read from its durable store, whatever it holds in memory.

``PlanHistory`` serves the ``Plans`` RPC and the stored part of ``Watch`` (a part of ``Agent``,
built with the store, the plan book and the role's plan type):

- ``page`` lists plans newest first from ``StateStore.history`` with the query's filters, each
  snapshot as much as the query's view asks: a summary, the plan with its step statuses, or also
  every step's record (``StepRecord``) rebuilt from the journal: the input it ran with
  (references resolved against the recorded outputs), its output, error, attempts, timing, and
  the revision and author that made it. Values pass through the audit log's redaction
  (``protocol.redact_value``) and are cut to fit the message limit (``full`` keeps them whole as
  far as the limit allows); a cut step says so.
- ``prune`` applies a retention to the store (``Agent.prune_history``).
- ``stored_events`` rebuilds the ``PlanEvent``\\ s of plans the book no longer holds (after a
  restart) from their journals, so a watcher replays them.

Without a store, or when the store cannot be read, the plan book's records answer, and the page
says what could not be read. The answer never holds more bytes than the agent's message limit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from stratagem.agents._records import PlanBook, PlanRecord
from stratagem.agents._wire import MESSAGE_LIMIT, plain_goal, stored_gate
from stratagem.planning import (
    CompensationRecord,
    CompensationStatus,
    CrossAgentStep,
    GateDecision,
    GateRecord,
    GateStep,
    HistoryQuery,
    Plan,
    PlanState,
    PlanStatus,
    PlanStatusRecord,
    PlanSummary,
    RefError,
    RevisionRecord,
    StateStore,
    Step,
    StepIntent,
    StepResult,
    StepStatus,
    StoreError,
    ToolStep,
    resolve_refs,
)
from stratagem.protocol import (
    DEFAULT_PLANS_PAGE,
    FieldViolation,
    InvalidArgumentError,
    PlanEvent,
    PlanSnapshot,
    PlansPage,
    PlansQuery,
    StepRecord,
    redact,
    redact_value,
)

__all__ = ["INTERRUPTED", "PlanHistory", "shrink"]

logger = logging.getLogger(__name__)

# What a page leaves free of the message limit, and what a snapshot or step costs beside its text.
_PAGE_HEADROOM: Final = 4096
_SNAPSHOT_OVERHEAD: Final = 256
_STEP_OVERHEAD: Final = 128

# How far a value is kept (characters of a string, items of a list or object, depth), first
# unless the query asks for whole values, then tighter until a snapshot fits the page; a cut step
# says so.
_SQUEEZES: Final = ((400, 25, 6), (100, 8, 4), (40, 3, 2), (0, 0, 0))

INTERRUPTED: Final = (
    "interrupted: its caller went away; it goes on when the request is made again, or when the "
    "agent restarts ('stratagem cancel' ends it)"
)
"""What a plan says whose run stopped with its caller, unfinished in the store."""

_STATUSES: Final = tuple(status.value for status in PlanStatus)
_COMPENSATION_STATUS: Final = {
    CompensationStatus.RUNNING: StepStatus.COMPENSATING,
    CompensationStatus.COMPENSATED: StepStatus.COMPENSATED,
    CompensationStatus.FAILED: StepStatus.COMPENSATION_FAILED,
}


def shrink(value: Any, limits: tuple[int, int, int]) -> tuple[Any, bool]:
    """``value`` with strings, lists and objects cut to ``limits`` (characters, items, depth),
    and whether anything was cut. A cut string ends with ``…``; a cut list or object gets one
    more item saying how many were left out (``"… 12 more"``). ``(0, 0, 0)`` cuts everything."""
    chars, items, depth = limits
    cut = False

    def walk(item: Any, level: int) -> Any:
        nonlocal cut
        if isinstance(item, str):
            if len(item) > chars:
                cut = True
                return item[:chars] + "…"
            return item
        if isinstance(item, dict | list) and level >= depth:
            cut = True
            return f"… {len(item)} {'keys' if isinstance(item, dict) else 'items'}"
        if isinstance(item, dict):
            keys = list(item)
            kept = {key: walk(item[key], level + 1) for key in keys[:items]}
            if len(keys) > items:
                cut = True
                kept["…"] = f"{len(keys) - items} more"
            return kept
        if isinstance(item, list):
            kept_items = [walk(element, level + 1) for element in item[:items]]
            if len(item) > items:
                cut = True
                kept_items.append(f"… {len(item) - items} more")
            return kept_items
        return item

    return walk(value, 0), cut


def _json(value: Any) -> str:
    return "" if value is None else json.dumps(value, separators=(",", ":"), default=str)


class PlanHistory:
    """An agent's history (see the module docstring).

    Args:
        role: The agent's role (named in snapshots).
        plan_type: The role's plan type (stored plans are read as it).
        book: The records the agent holds in memory.
        store: The agent's durable store (``None``: the book alone).
        running: Whether a run of the plan goes on here now (a stored plan that is running but
            has no run here was interrupted, and says so).
    """

    def __init__(
        self,
        role: str,
        plan_type: type[Plan],
        book: PlanBook,
        store: StateStore | None,
        *,
        running: Callable[[str], bool] = lambda _: True,
    ) -> None:
        self._role = role
        self._plan_type = plan_type
        self._book = book
        self._store = store
        self._running = running

    # --- pages -----------------------------------------------------------------------------

    async def page(self, query: PlansQuery, max_bytes: int) -> PlansPage:
        """One page of plans as ``query`` asks, at most ``max_bytes`` of message.

        Raises:
            protocol.InvalidArgumentError: A status that is not a plan status.
        """
        status = _status(query.status)
        size = query.page_size or DEFAULT_PLANS_PAGE
        budget = max(1, max_bytes - _PAGE_HEADROOM)
        if self._store is not None:
            history = HistoryQuery(
                plan_id=query.plan_id,
                status=status,
                goal=query.goal,
                text=query.text,
                since=query.since or None,
                until=query.until or None,
                trace_id=query.trace_id,
                after=int(query.page_token) if query.page_token else None,
                limit=size + 1,
                # A plan and its sub-plans in the order they were made: the plan first.
                oldest_first=bool(query.plan_id),
            )
            try:
                summaries = await self._store.history(history)
            except StoreError as exc:
                logger.warning("agent %s: the history cannot be read: %s", self._role, exc)
                unreadable = [
                    f"the {self._role} agent's store cannot be read ({exc}); listed: the plans "
                    "it holds in memory"
                ]
                return self._book_page(query, status, size, budget, unreadable)
            return await self._store_page(query, summaries, size, budget)
        return self._book_page(query, status, size, budget, [])

    async def _store_page(
        self, query: PlansQuery, summaries: list[PlanSummary], size: int, budget: int
    ) -> PlansPage:
        more = len(summaries) > size
        plans: list[PlanSnapshot] = []
        unreadable: list[str] = []
        used = 0
        for summary in summaries[:size]:
            snapshot, problem = await self._snapshot(summary, query.view, query.full, budget)
            cost = _cost(snapshot)
            if plans and used + cost > budget:
                more = True
                break
            plans.append(snapshot)
            used += cost
            if problem:
                unreadable.append(problem)
        token = plans[-1].cursor if more and plans else ""
        return PlansPage(plans=plans, next_page_token=token, unreadable=unreadable[:100])

    async def snapshot(self, plan_id: str, *, max_bytes: int) -> PlanSnapshot | None:
        """The plan's snapshot with its steps' records (``None`` when it is not stored)."""
        if self._store is None:
            return None
        found = await self._store.history(HistoryQuery(plan_id=plan_id, limit=10_000))
        summary = next((s for s in found if s.plan_id == plan_id), None)
        if summary is None:
            return None
        snapshot, _ = await self._snapshot(summary, "steps", False, max_bytes - _PAGE_HEADROOM)
        return snapshot

    async def _snapshot(
        self, summary: PlanSummary, view: str, full: bool, budget: int
    ) -> tuple[PlanSnapshot, str]:
        """A stored plan's snapshot as ``view`` asks, and a line saying what could not be read
        ("" when all could)."""
        snapshot = PlanSnapshot(
            plan_id=summary.plan_id,
            agent=self._role,
            revision=summary.revision,
            status=summary.status.value,
            goal=plain_goal(summary.goal)[:2000],
            created=max(summary.created, 0.0),
            updated=max(summary.updated, 0.0),
            trace_id=summary.trace_id,
            message=redact(summary.message, MESSAGE_LIMIT),
            cursor=str(summary.cursor),
        )
        if summary.status is PlanStatus.RUNNING and not self._running(summary.plan_id):
            snapshot = snapshot.model_copy(update={"message": INTERRUPTED})
        if view == "summary":
            return snapshot, ""
        assert self._store is not None
        try:
            state = await self._store.load(summary.plan_id)
            if state is None:  # pruned since it was listed
                return snapshot, ""
            plan = state.plan(self._plan_type)
            revisions = await self._store.revisions(summary.plan_id) if view == "steps" else []
        except (StoreError, ValidationError, ValueError) as exc:
            line = f"plan {summary.plan_id!r}: its record cannot be read ({_one_line(exc)})"
            return snapshot, line
        statuses = {step.id: _step_status(step, state) for step in plan.steps}
        body = plan.model_copy(
            update={
                "steps": [
                    step.model_copy(update={"status": statuses[step.id]}) for step in plan.steps
                ]
            }
        )
        plan_json = _json(redact_value(body.model_dump(mode="json")))
        steps_by_id = {step.id: step for step in plan.steps}
        update: dict[str, Any] = {
            "plan_json": plan_json,
            "revision": state.revision,
            "gates": [
                stored_gate(gate, steps_by_id.get(gate_id)) for gate_id, gate in state.gates.items()
            ],
        }
        if view == "steps":
            update["steps"] = _fitted(
                [
                    _step_record(step, statuses[step.id], state, made, plan.inputs)
                    for step, made in zip(plan.steps, _makers(plan, revisions), strict=True)
                ],
                full=full,
                budget=budget - len(plan_json),
            )
        return snapshot.model_copy(update=update), ""

    def _book_page(
        self,
        query: PlansQuery,
        status: PlanStatus | None,
        size: int,
        budget: int,
        unreadable: list[str],
    ) -> PlansPage:
        """A page of the plans the book holds (no store, or one that cannot be read), newest
        first; its cursors are positions in that list."""
        held = self._book.records()
        ordered = held if query.plan_id else list(reversed(held))
        records = [r for r in ordered if _book_match(r, query, status)]
        start = int(query.page_token) if query.page_token else 0
        plans: list[PlanSnapshot] = []
        used = 0
        end = start
        for index, record in enumerate(records[start : start + size], start + 1):
            snapshot = self._book_snapshot(record, query.view, str(index))
            cost = _cost(snapshot)
            if plans and used + cost > budget:
                break
            plans.append(snapshot)
            used += cost
            end = index
        token = str(end) if end < len(records) else ""
        return PlansPage(plans=plans, next_page_token=token, unreadable=unreadable)

    def _book_snapshot(self, record: PlanRecord, view: str, cursor: str) -> PlanSnapshot:
        snapshot = record.snapshot(self._role)
        events = record.events
        created = events[0].timestamp if events else 0.0
        updated = events[-1].timestamp if events else 0.0
        message = next((e.message for e in reversed(events) if not e.step_id), "")
        return snapshot.model_copy(
            update={
                "plan_json": "" if view == "summary" else snapshot.plan_json,
                "goal": plain_goal(record.plan.goal)[:2000],
                "created": created,
                "updated": updated,
                "message": redact(message, MESSAGE_LIMIT),
                "cursor": cursor,
            }
        )

    # --- stored events ---------------------------------------------------------------------

    async def prune(self, *, older_than_s: float | None, keep: int | None) -> int:
        """Delete the store's finished plans last changed more than ``older_than_s`` seconds ago,
        and those beyond the ``keep`` most recent: how many plan revisions went (none without a
        store)."""
        if self._store is None:
            return 0
        deleted = 0
        if older_than_s is not None:
            deleted += await self._store.prune(before=time.time() - older_than_s)
        if keep is not None:
            deleted += await self._store.prune(keep_last=keep)
        if deleted:
            logger.info(
                "agent %s: %d plan revisions past the retention deleted", self._role, deleted
            )
        return deleted

    async def stored_events(self, plan_id: str) -> list[PlanEvent]:
        """The events of ``plan_id`` and its sub-plans that the book does not hold, rebuilt from
        the store's journals (every revision), in the order they happened."""
        if self._store is None or not plan_id:
            return []
        try:
            summaries = await self._store.history(HistoryQuery(plan_id=plan_id, limit=10_000))
            events: list[PlanEvent] = []
            for summary in reversed(summaries):  # oldest first
                if summary.plan_id in self._book:
                    continue
                revisions = await self._store.revisions(summary.plan_id)
                numbers = sorted({r.revision for r in revisions} | {summary.revision})
                for revision in numbers:
                    journal = await self._store.journal(summary.plan_id, revision)
                    events.extend(_events(journal, self._role))
        except StoreError as exc:
            logger.warning("agent %s: stored events of %s unreadable: %s", self._role, plan_id, exc)
            return []
        # Stable: records of one plan stay in journal order when their times tie (or are 0).
        events.sort(key=lambda event: event.timestamp)
        return events


# --- building blocks ---------------------------------------------------------------------------


def _status(value: str) -> PlanStatus | None:
    if not value:
        return None
    if value not in _STATUSES:
        raise InvalidArgumentError(
            f"unknown plan status {value!r}",
            violations=(FieldViolation("status", f"must be one of {', '.join(_STATUSES)}"),),
        )
    return PlanStatus(value)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _cost(snapshot: PlanSnapshot) -> int:
    steps = sum(
        len(step.input_json) + len(step.output_json) + len(step.message) + _STEP_OVERHEAD
        for step in snapshot.steps
    )
    return len(snapshot.plan_json) + len(snapshot.goal) + steps + _SNAPSHOT_OVERHEAD


def _step_status(step: Step, state: PlanState) -> StepStatus:
    """A step's status from the journal: its last record, a gate still open, a compensation, or
    (never started) pending while the plan goes on and skipped once it ended."""
    gate = state.gates.get(step.id)
    recorded = state.steps.get(step.id)
    if gate is not None and gate.decision is GateDecision.OPEN:
        return StepStatus.BLOCKED
    if recorded is not None:
        status = recorded.status
        for entry in state.compensations:
            if entry.step_id == step.id and entry.status in _COMPENSATION_STATUS:
                status = _COMPENSATION_STATUS[entry.status]
        return status
    return StepStatus.SKIPPED if state.status.is_final else StepStatus.PENDING


def _makers(plan: Plan, revisions: Sequence[RevisionRecord]) -> list[tuple[int, str]]:
    """For each step of ``plan``: the revision that made it as it is, and that revision's
    author (the first revision's is the plan's provenance, a planner or a model)."""
    first = min((r.revision for r in revisions), default=plan.revision)
    author = plan.provenance.author if plan.provenance is not None else ""
    made = {step.id: (first, author) for step in plan.steps}
    for record in sorted(revisions, key=lambda r: r.revision):
        if record.parent is None:
            continue
        changed = [*record.diff.added, *(c.step_id for c in record.diff.changed)]
        for step_id in changed:
            made[step_id] = (record.revision, record.author)
    return [made[step.id] for step in plan.steps]


def _step_record(
    step: Step,
    status: StepStatus,
    state: PlanState,
    made: tuple[int, str],
    inputs: Mapping[str, Any],
) -> StepRecord:
    """The record of ``step``: its input as the engine resolved it for the tool (references
    and expressions over earlier outputs and the plan's ``inputs``), its status and result."""
    recorded = state.steps.get(step.id)
    gate = state.gates.get(step.id)
    attempts = recorded.attempt if recorded is not None else 0
    declared: dict[str, Any] | None
    match step:
        case ToolStep():
            does, declared = step.tool, step.input
        case CrossAgentStep():
            does, declared = f"{step.target}.{step.capability}", step.request
        case GateStep():
            does, declared = step.prompt, None
        case _:
            does, declared = step.kind, None
    given: Any = declared
    if declared is not None and attempts:
        try:
            given = resolve_refs(declared, state.outputs, inputs)
        except RefError:
            given = declared
    message = recorded.message if recorded is not None else ""
    if gate is not None:
        message = _gate_line(gate.decision, gate.prompt, gate.approver, gate.rationale)
    output = recorded.output if recorded is not None else None
    return StepRecord(
        step_id=step.id,
        kind=step.kind,
        does=redact(does, 2000),
        status=status.value,
        attempts=attempts,
        started=(recorded.started or 0.0) if recorded is not None else 0.0,
        ended=(recorded.ended or 0.0) if recorded is not None else 0.0,
        input_json=_json(redact_value(given)) if given else "",
        output_json=_json(redact_value(output)),
        failure_class=(
            recorded.failure_class.value
            if recorded is not None and recorded.failure_class is not None
            else ""
        ),
        message=redact(message, MESSAGE_LIMIT),
        revision=made[0],
        author=made[1][:300],
        depends_on=list(step.depends_on),
    )


def _gate_line(decision: GateDecision, prompt: str, approver: str, rationale: str) -> str:
    if decision is GateDecision.OPEN:
        return f"waiting for approval: {prompt}"
    why = f": {rationale}" if rationale else ""
    return f"{decision.value} by {approver or 'someone'}{why}"


def _fitted(steps: list[StepRecord], *, full: bool, budget: int) -> list[StepRecord]:
    """``steps`` with their values cut: to the preview unless ``full``, then tighter until they
    fit ``budget`` bytes."""
    tries: list[tuple[int, int, int] | None] = [None, *_SQUEEZES] if full else list(_SQUEEZES)
    current = steps
    for limits in tries:
        current = steps if limits is None else [_cut(step, limits) for step in steps]
        size = sum(len(s.input_json) + len(s.output_json) + _STEP_OVERHEAD for s in current)
        if size <= budget:
            return current
    return current


def _cut(step: StepRecord, limits: tuple[int, int, int]) -> StepRecord:
    given, input_cut = _cut_json(step.input_json, limits)
    output, output_cut = _cut_json(step.output_json, limits)
    if not (input_cut or output_cut):
        return step
    return step.model_copy(update={"input_json": given, "output_json": output, "cut": True})


def _cut_json(text: str, limits: tuple[int, int, int]) -> tuple[str, bool]:
    if not text:
        return text, False
    value, cut = shrink(json.loads(text), limits)
    return (_json(value), True) if cut else (text, False)


def _book_match(record: PlanRecord, query: PlansQuery, status: PlanStatus | None) -> bool:
    plan_id = record.plan.id
    if query.plan_id and not (plan_id == query.plan_id or plan_id.startswith(query.plan_id + "/")):
        return False
    if status is not None and record.status is not status:
        return False
    if query.goal and query.goal.lower() not in record.plan.goal.lower():
        return False
    if query.trace_id:
        return False  # the book keeps no trace ids
    events = record.events
    created = events[0].timestamp if events else 0.0
    if query.since and created < query.since:
        return False
    if query.until and created >= query.until:
        return False
    if query.text:
        needle = query.text.lower()
        texts = [plan_id, record.plan.goal, *(e.message for e in events)]
        if not any(needle in text.lower() for text in texts):
            return needle in record.plan.model_dump_json().lower()
    return True


def _events(journal: Sequence[Any], role: str) -> list[PlanEvent]:
    """The ``PlanEvent``\\ s a journal's records stand for (``Watch``'s vocabulary)."""
    events: list[PlanEvent] = []
    last = 0.0
    for record in journal:
        at = getattr(record, "at", 0.0) or last
        last = at
        event: dict[str, Any] | None = None
        match record:
            case PlanStatusRecord():
                event = {"status": record.status.value, "message": record.message}
            case StepIntent():
                event = {"step_id": record.step_id, "status": "running", "attempt": record.attempt}
            case StepResult():
                event = {
                    "step_id": record.step_id,
                    "status": record.status.value,
                    "attempt": record.attempt,
                    "failure_class": record.failure_class.value if record.failure_class else "",
                    "message": record.message,
                }
            case GateRecord() if record.decision is GateDecision.OPEN:
                # As the engine says it live: the gate's prompt.
                event = {"step_id": record.gate_id, "status": "blocked", "message": record.prompt}
            case CompensationRecord() if record.status in _COMPENSATION_STATUS:
                event = {
                    "step_id": record.step_id,
                    "status": _COMPENSATION_STATUS[record.status].value,
                    "attempt": record.attempt,
                    "message": record.message,
                }
        if event is None:
            continue
        event["message"] = redact(str(event.get("message", "")), MESSAGE_LIMIT)
        events.append(
            PlanEvent(
                plan_id=record.plan_id,
                revision=record.revision,
                timestamp=max(at, 0.0),
                agent=role,
                **event,
            )
        )
    return events
