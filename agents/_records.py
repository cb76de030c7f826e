"""What an agent remembers about its plans, and the events it streams to watchers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from stratagem.planning import Plan, PlanResult, PlanStatus, StepStatus
from stratagem.protocol import PlanEvent, PlanSnapshot

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
        events: Every event of the run, in order.
        result: The run's result, once it finished.
        steps: Each step's latest status.
    """

    plan: Plan
    capability: str = ""
    status: PlanStatus = PlanStatus.PENDING
    events: list[PlanEvent] = field(default_factory=list)
    result: PlanResult[Any] | None = None
    steps: dict[str, StepStatus] = field(default_factory=dict)
    # The agent-wide sequence number of each event, so watchers merge several plans in order.
    _seqs: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

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
        )


def _matches(plan_id: str, wanted: str) -> bool:
    return not wanted or plan_id == wanted or plan_id.startswith(wanted + "/")
