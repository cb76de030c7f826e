"""Failure policy, budgets and circuit breakers."""

from __future__ import annotations

from typing import Final, TypeVar

from stratagem.planning._engine._restore import _Restore
from stratagem.planning._plan import FailureClass, Plan, Step, ToolStep

P = TypeVar("P", bound=Plan)

_RETRYABLE: Final = frozenset({FailureClass.TRANSIENT, FailureClass.TIMEOUT})


class _Policy(_Restore[P]):
    def _admit(self, step: Step) -> tuple[str, bool, float | None]:
        """Check the breaker and reserve the budget for one attempt of ``step``.

        Returns:
            ``("", False, cost)`` when the attempt may start (``cost``: the cost units reserved,
            ``None`` without a budget); otherwise ``(why, abort, None)`` with ``abort`` True for a
            budget that ran out.
        """
        if isinstance(step, ToolStep) and self.breakers:
            denial = self.engine.breaker_denial(step.tool)
            if denial:
                return denial, False, None
        budget = self.budget
        if budget is None:
            return "", False, None
        cost = 1.0
        if isinstance(step, ToolStep):
            cost = float(self.tools.cost(step.tool))
        if budget.wall_time_s is not None and self.started_at is not None:
            used = self.clock() - self.started_at
            if used >= budget.wall_time_s:
                return (
                    f"budget exhausted: wall time {used:.1f}s/{budget.wall_time_s:g}s used; "
                    f"step {step.id!r} not started",
                    True,
                    None,
                )
        if budget.tool_calls is not None and self.spent_calls + 1 > budget.tool_calls:
            return (
                f"budget exhausted: tool_calls {self.spent_calls}/{budget.tool_calls} used; "
                f"step {step.id!r} needs 1 more",
                True,
                None,
            )
        if budget.cost_units is not None and self.spent_cost + cost > budget.cost_units + 1e-9:
            return (
                f"budget exhausted: cost_units {self.spent_cost:g}/{budget.cost_units:g} used; "
                f"step {step.id!r} needs {cost:g} more",
                True,
                None,
            )
        self.spent_calls += 1
        self.spent_cost += cost
        return "", False, cost

    def _deny(self, step: Step, attempts: int, message: str, abort: bool) -> None:
        """An attempt of ``step`` may not start: a policy gate, or a policy failure."""
        if not abort and step.on_policy_failure == "gate":
            self._policy_gate(step, attempts, message)
            return
        self._fail(step.id, FailureClass.POLICY, message, attempts)
        self._stop(f"the plan stopped after step {step.id!r} failed")
