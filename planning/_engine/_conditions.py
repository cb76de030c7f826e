"""Conditions and routes: whether a step that needs deciding runs or is skipped.

A step is decided when all its dependencies have settled, before it starts, if it has a
condition (``when``), runs on failure (``runs_on="failure"``), or has a dependency that did not
succeed. A condition's value is journaled (``ConditionRecord``) before the step starts or is
skipped; a resumed run takes a recorded decision instead of evaluating the condition again.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from stratagem.planning._engine._state import _RunState
from stratagem.planning._errors import ExpressionError
from stratagem.planning._expr import expression, truthy
from stratagem.planning._plan import FailureClass, Step, StepStatus
from stratagem.planning._store import ConditionRecord

logger = logging.getLogger(__name__)

# The longest condition value quoted in a skip's reason.
_SHOWN: Final = 200


class _Conditions:
    """Decides the steps the state marks undecided; the state makes the transitions."""

    def __init__(self, state: _RunState[Any]) -> None:
        self.state = state
        self.recorded: dict[str, ConditionRecord] = {}  # a resumed run's recorded decisions

    def found(self, record: ConditionRecord) -> None:
        """A resumed run finds a recorded decision for a step it has not started."""
        self.recorded[record.step_id] = record

    def decide(self, step: Step) -> bool:
        """Whether ``step`` runs now; when not, it is skipped (or failed) through the state."""
        state = self.state
        statuses = state.statuses
        if step.runs_on == "failure":
            if not any(statuses[dep] is StepStatus.FAILED for dep in step.depends_on):
                state.skip(step.id, "it runs on failure, and no dependency failed")
                return False
        else:
            blocked = state.blocked_by.get(step.id)
            if blocked is not None:
                state.skip(step.id, f"dependency {blocked!r} {statuses[blocked].value}")
                return False
        when = step.when
        if when is None:
            state.decided(step.id)
            return True
        recorded = self.recorded.pop(step.id, None)
        if recorded is not None:
            holds, value_json = recorded.holds, recorded.value_json
        else:
            try:
                value = expression(when).evaluate(state.outputs, state.plan.inputs)
            except ExpressionError as exc:
                state.fail(
                    step.id,
                    FailureClass.LOGIC,
                    f"the condition cannot be evaluated: {exc}",
                    0,
                    stop=f"the plan stopped after step {step.id!r} failed",
                )
                return False
            holds = truthy(value)
            value_json = json.dumps(value, separators=(",", ":"), default=str)
            state.condition(step.id, holds, value_json)
        if holds:
            state.decided(step.id)
            return True
        shown = value_json if len(value_json) <= _SHOWN else value_json[:_SHOWN] + "..."
        state.skip(step.id, f"condition {when!r} is false (value: {shown})")
        return False
