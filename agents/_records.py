"""What an agent remembers about its plans, and the events it streams to watchers.

``PlanBook`` keeps the most recent plans' records (``MAX_RECORDS``, the oldest finished ones
forgotten first) with every event of each, numbered agent-wide so that a watcher of several plans
gets them in order. A Watch stream replays the stored events, then follows live ones; a reader more
than ``WATCH_QUEUE_LIMIT`` events behind is told so (``RESOURCE_EXHAUSTED``) and dropped, never
waited for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

from stratagem.agents._wire import MESSAGE_LIMIT, gate_info, plan_event, stored_gate
from stratagem.planning import (
    FailureClass,
    GateDecision,
    Plan,
    PlanResult,
    PlanState,
    PlanStatus,
    StepEvent,
    StepStatus,
)
from stratagem.protocol import (
    GateInfo,
    NotFoundError,
    PlanEvent,
    PlanSnapshot,
    ResourceExhaustedError,
)

__all__ = [
    "MAX_RECORDS",
    "WATCH_QUEUE_LIMIT",
    "PlanBook",
    "PlanRecord",
    "follow_revision",
]

logger = logging.getLogger(__name__)

MAX_RECORDS: Final = 1000
"""Plans an agent remembers (the oldest finished ones are forgotten first)."""

_TERMINAL: Final = frozenset({PlanStatus.SUCCEEDED, PlanStatus.FAILED, PlanStatus.CANCELLED})


WATCH_QUEUE_LIMIT: Final = 1000
"""Live events a Watch stream may have waiting; a reader further behind gets RESOURCE_EXHAUSTED."""


@dataclass(slots=True)
class PlanRecord:
    """What an agent remembers about one plan.

    Attributes:
        plan: The plan as it was submitted (its typed fields included).
        capability: The capability it served ("" for a plan submitted directly).
        status: Where the run is.
        result: The run's result, once it finished.
        steps: Each step's latest status.
        agent: The role of the agent that keeps the record (named in its events).
        gates: Each gate's latest state (what it asks, who decides, its deadline, its decision),
            from its events or the store.
    """

    plan: Plan
    capability: str = ""
    status: PlanStatus = PlanStatus.PENDING
    result: PlanResult[Any] | None = None
    steps: dict[str, StepStatus] = field(default_factory=dict)
    agent: str = ""
    gates: dict[str, GateInfo] = field(default_factory=dict)
    # The run's events as the engine reported them; each becomes a ``PlanEvent`` when first read
    # (``events``) or sent to a watcher, so a plan nobody watches builds none.
    _events: list[PlanEvent | StepEvent] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    # The agent-wide sequence number of each event, so watchers merge several plans in order.
    _seqs: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def events(self) -> list[PlanEvent]:
        """Every event of the run, in order."""
        events = self._events
        for index, event in enumerate(events):
            if isinstance(event, StepEvent):
                events[index] = plan_event(event, self.agent)
        return cast("list[PlanEvent]", events)

    def snapshot(self, agent: str) -> PlanSnapshot:
        """The record as a ``PlanSnapshot``: the typed plan with its step statuses, as JSON."""
        plan = self.plan
        if self.steps:
            plan = plan.model_copy(
                update={
                    "steps": [
                        step.model_copy(update={"status": self.steps.get(step.id, step.status)})
                        for step in plan.steps
                    ]
                }
            )
        return PlanSnapshot(
            plan_id=plan.id,
            agent=agent,
            revision=plan.revision,
            status=self.status.value,
            plan_json=plan.model_dump_json(),
            gates=list(self.gates.values()),
        )


def follow_revision(record: PlanRecord, result: PlanResult[Any]) -> None:
    """Point ``record`` at the revision that ran last."""
    # The engine may have replaced the plan by a new revision mid-run (a replan after a logic
    # failure); the record shows the revision that ran last.
    if result.submitted.revision != record.plan.revision:
        record.plan = result.submitted


def _matches(plan_id: str, wanted: str) -> bool:
    return not wanted or plan_id == wanted or plan_id.startswith(wanted + "/")


class PlanBook:
    """The records of one agent's recent plans, and the watchers of their events.

    Args:
        role: The agent's role (named in snapshots, events and errors).
        max_records: How many plans to remember.
    """

    def __init__(self, role: str, max_records: int = MAX_RECORDS) -> None:
        self.role = role
        self._records: OrderedDict[str, PlanRecord] = OrderedDict()
        self._max_records = max_records
        self._seq = itertools.count(1)
        self._watchers: set[asyncio.Queue[tuple[int, PlanEvent]]] = set()
        self._lagging: set[asyncio.Queue[tuple[int, PlanEvent]]] = set()

    def __contains__(self, plan_id: str) -> bool:
        return plan_id in self._records

    def records(self) -> list[PlanRecord]:
        """Every record held, oldest first."""
        return list(self._records.values())

    def get(self, plan_id: str) -> PlanRecord | None:
        """The record of ``plan_id``, or ``None`` when it is not remembered."""
        return self._records.get(plan_id)

    async def first_event(self, plan_id: str) -> None:
        """Return once plan ``plan_id`` reports its first event here."""
        async for event in self.watch(plan_id):
            if event.plan_id == plan_id:
                return

    async def blocked(self, plan_id: str) -> None:
        """Return once plan ``plan_id`` waits at a gate here (or has ended)."""
        async for event in self.watch(plan_id):
            if event.plan_id == plan_id and not event.step_id and event.status == "blocked":
                return

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        """Stream the events of ``plan_id`` and of every plan whose id starts with ``plan_id/``.

        Stored events come first, then live ones. The stream ends after the plan ``plan_id``
        itself reaches a final status on this agent; when that plan is not this agent's, it goes on
        until the consumer stops iterating.

        Args:
            plan_id: The plan; ``""`` streams every plan.

        Yields:
            The events, in the order they happened.
        """
        queue: asyncio.Queue[tuple[int, PlanEvent]] = asyncio.Queue(WATCH_QUEUE_LIMIT)
        self._watchers.add(queue)
        try:
            stored: list[tuple[int, PlanEvent]] = []
            for record in self._records.values():
                if _matches(record.plan.id, plan_id):
                    stored.extend(zip(record._seqs, record.events, strict=True))
            stored.sort(key=lambda item: item[0])
            last = 0
            for seq, event in stored:
                last = seq
                yield event
                if self._ends(event, plan_id):
                    return
            while True:
                seq, event = await queue.get()
                if queue in self._lagging:
                    raise ResourceExhaustedError(
                        f"this Watch stream fell more than {WATCH_QUEUE_LIMIT} events behind and "
                        "was dropped; watch again (stored events are replayed)"
                    )
                if seq <= last or not _matches(event.plan_id, plan_id):
                    continue
                yield event
                if self._ends(event, plan_id):
                    return
        finally:
            self._watchers.discard(queue)
            self._lagging.discard(queue)

    def plans(self, plan_id: str) -> list[PlanSnapshot]:
        """Snapshots of ``plan_id`` and its sub-plans (``""``: every remembered plan)."""
        return [
            record.snapshot(self.role)
            for record in self._records.values()
            if _matches(record.plan.id, plan_id)
        ]

    def record(self, plan_id: str) -> PlanRecord:
        """The record of one plan.

        Raises:
            protocol.NotFoundError: The agent does not remember that plan.
        """
        try:
            return self._records[plan_id]
        except KeyError:
            raise NotFoundError(f"the {self.role} agent has no plan {plan_id!r}") from None

    def recall(self, plan: Plan, state: PlanState) -> PlanRecord:
        """The record of a stored plan, made (or refreshed) from its state."""
        record = self._records.get(plan.id)
        if record is None or record.plan.revision != plan.revision:
            record = self.remember(PlanRecord(plan=plan))
        record.status = state.status
        for step_id, step in state.steps.items():
            record.steps[step_id] = step.status
        for gate_id, gate in state.gates.items():
            if gate.decision is GateDecision.OPEN:
                record.steps[gate_id] = StepStatus.BLOCKED
            record.gates[gate_id] = stored_gate(
                gate, next((step for step in plan.steps if step.id == gate_id), None)
            )
        return record

    def refuse(self, plan: Plan, capability: str, message: str) -> None:
        record = self.remember(PlanRecord(plan=plan, capability=capability))
        record.status = PlanStatus.FAILED
        event = PlanEvent(
            plan_id=plan.id,
            revision=plan.revision,
            status=PlanStatus.FAILED.value,
            failure_class=FailureClass.LOGIC.value,
            message=message[:MESSAGE_LIMIT],
            timestamp=time.time(),
            agent=self.role,
        )
        self.publish(record, event)
        logger.info("agent %s refused plan %s: %s", self.role, plan.id, message)

    def remember(self, record: PlanRecord) -> PlanRecord:
        plan_id = record.plan.id
        previous = self._records.pop(plan_id, None)
        if previous is not None:
            # Keep the history of earlier revisions: watchers replay it in order.
            record._events = previous._events + record._events
            record._seqs = previous._seqs + record._seqs
        record.agent = self.role
        self._records[plan_id] = record
        while len(self._records) > self._max_records:
            victim = next(
                (pid for pid, r in self._records.items() if r.status in _TERMINAL),
                next(iter(self._records)),
            )
            del self._records[victim]
        return record

    def observe(self, record: PlanRecord, event: StepEvent) -> None:
        if event.step_id:
            if isinstance(event.status, StepStatus):
                record.steps[event.step_id] = event.status
            if event.gate is not None:
                record.gates[event.step_id] = gate_info(event.gate)
        elif isinstance(event.status, PlanStatus):
            record.status = event.status
        self.publish(record, event)

    def publish(self, record: PlanRecord, event: PlanEvent | StepEvent) -> None:
        seq = next(self._seq)
        if self._watchers:
            if isinstance(event, StepEvent):
                event = plan_event(event, self.role)
            for queue in list(self._watchers):
                if queue.full():  # a reader this far behind is told so and dropped, never waited
                    self._watchers.discard(queue)
                    self._lagging.add(queue)
                else:
                    queue.put_nowait((seq, event))
        record._events.append(event)  # a StepEvent becomes a PlanEvent if it is ever read
        record._seqs.append(seq)

    def _ends(self, event: PlanEvent, plan_id: str) -> bool:
        return (
            bool(plan_id)
            and event.plan_id == plan_id
            and not event.step_id
            and event.status in {status.value for status in _TERMINAL}
        )
