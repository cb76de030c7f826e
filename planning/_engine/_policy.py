"""What happens after a step's outcome, and whether an attempt may start.

``FailurePolicy`` is the one place that decides, from a failure, whether a step is retried,
fails, is held at a policy gate, or (after the run stopped) whether the plan may be replanned;
it is also the one place that names the failure classes that are retried (and that count
against a tool's circuit breaker). The rest of the engine acts on its ``Action``s.

Beside it, admission: ``_Breakers`` (the engine's per-tool circuit breakers) and ``_Admission``
(one run's budget account), asked before every attempt.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from stratagem.planning._engine._types import CircuitBreakerConfig, ToolRunner
from stratagem.planning._errors import StepFailure, StoreError
from stratagem.planning._kinds import tool_of
from stratagem.planning._plan import (
    Budget,
    FailureClass,
    RetryPolicy,
    Step,
)
from stratagem.planning._revisions import REPLANNED
from stratagem.planning._store import BreakerState, StateStore

logger = logging.getLogger(__name__)

RETRYABLE: Final = frozenset({FailureClass.TRANSIENT, FailureClass.TIMEOUT})
"""The failure classes retried by default: the failure may not happen again."""


class Action(enum.Enum):
    """What the engine does with a failed attempt of a step."""

    RETRY = "retry"
    """Wait out the backoff, then attempt the step again."""
    FAIL = "fail"
    """The step fails for good; the plan stops (and may be replanned: ``may_replan``)."""
    GATE = "gate"
    """Hold the step at a policy gate until an operator approves a re-run or rejects it."""


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """Decides what follows a failure; the engine's only such rules.

    Attributes:
        retryable: The failure classes that are retried (up to ``step.retry.max_attempts``) and
            that count against a tool's circuit breaker.
    """

    retryable: frozenset[FailureClass] = RETRYABLE

    def after_attempt(self, step: Step, failure_class: FailureClass, tries: int) -> Action:
        """The action after the ``tries``-th attempt of ``step`` failed with ``failure_class``.

        Compensations ask it too (with their own count of tries); for them anything but
        ``RETRY`` means the compensation failed.
        """
        if failure_class in self.retryable and tries < step.retry.max_attempts:
            return Action.RETRY
        return self.after_failure(step, failure_class)

    def after_failure(self, step: Step, failure_class: FailureClass) -> Action:
        """The action when ``step`` fails for good: a policy gate, if it asks for one, or fail."""
        if failure_class is FailureClass.POLICY and step.on_policy_failure == "gate":
            return Action.GATE
        return Action.FAIL

    def after_denial(self, step: Step, exhausted: bool) -> Action:
        """The action when admission refuses an attempt of ``step`` (a ``policy`` failure).

        A budget that ran out (``exhausted``) is never held at a gate: no decision refills it.
        """
        return Action.FAIL if exhausted else self.after_failure(step, FailureClass.POLICY)

    def may_replan(
        self,
        failures: Sequence[StepFailure],
        classes: frozenset[FailureClass] = REPLANNED,
    ) -> bool:
        """Whether a plan that stopped with ``failures`` may be handed to the replanner.

        Only failures of ``classes`` (the replanner's ``failure_classes``; by default ``logic``
        only: a new revision can fix a wrong plan, not a flaky tool), and never ``cancelled``:
        an operator's cancellation is not planned around.
        """
        allowed = classes - {FailureClass.CANCELLED}
        return bool(failures) and all(f.failure_class in allowed for f in failures)


def step_is_idempotent(step: Step, tools: ToolRunner) -> bool:
    """Whether running ``step`` twice is the same as running it once (so a resumed run may run
    it again when it was in flight)."""
    # A step that calls no tool is idempotent: a cross-agent request (or a map's request per
    # item) is answered once by its target's store, a gate is decided, a nested plan resumes
    # from its own journal. A tool call is as idempotent as its tool says.
    tool = tool_of(step)
    return tool is None or tools.is_idempotent(tool)


def backoff_delay(policy: RetryPolicy, failed_attempt: int, rng: random.Random) -> float:
    """The delay after attempt ``failed_attempt`` (from 1) failed, jittered with ``rng``."""
    base = min(
        policy.max_backoff_s,
        policy.initial_backoff_s * policy.multiplier ** (failed_attempt - 1),
    )
    factor = 1.0 + rng.uniform(-policy.jitter, policy.jitter) if policy.jitter else 1.0
    return min(policy.max_backoff_s, base * factor)


class _Breakers:
    """The engine's per-tool circuit breakers (``CircuitBreakerConfig``), shared by its runs."""

    def __init__(
        self,
        config: CircuitBreakerConfig | None,
        policy: FailurePolicy,
        store: StateStore | None,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.policy = policy
        self.store = store
        self.clock = clock
        self.states: dict[str, BreakerState] = {}
        self.loaded = store is None

    async def load(self) -> None:
        """Take the persisted breakers (once per engine)."""
        if self.loaded or self.store is None:
            return
        self.loaded = True
        for state in await self.store.breakers():
            self.states.setdefault(state.tool, state)

    def denial(self, tool: str) -> str:
        """Why a call of ``tool`` may not start now ("" when it may)."""
        state = self.states.get(tool)
        settings = self.config
        if state is None or state.opened_at is None or settings is None:
            return ""
        retry_at = state.opened_at + settings.reset_after_s
        now = self.clock()
        if now >= retry_at:
            return ""  # half-open: one more call may show the tool is back
        when = datetime.fromtimestamp(retry_at, UTC).isoformat(timespec="seconds")
        return (
            f"circuit open for tool {tool!r} after {state.failures} failures; retry after "
            f"{when} (in {retry_at - now:.1f}s)"
        )

    async def record(
        self, tool: str, failure_class: FailureClass | None, *, resumed: bool = False
    ) -> None:
        """Count an attempt's outcome on ``tool``'s breaker; persist a change.

        A resumed run's failures are not counted (``resumed``): a plan taken up again from its
        journal, whose caller may be long gone, never opens a breaker that then refuses other
        callers' goals. Its successes still close one.
        """
        settings = self.config
        if settings is None or (resumed and failure_class is not None):
            return
        previous = self.states.get(tool)
        if failure_class is None:
            if previous is None or (previous.failures == 0 and previous.opened_at is None):
                return
            state = BreakerState(tool)
            logger.info("circuit for tool %s closed", tool)
        elif failure_class in self.policy.retryable:
            failures = (0 if previous is None else previous.failures) + 1
            opened_at = None if previous is None else previous.opened_at
            if failures >= settings.failure_threshold:
                opened_at = self.clock()
                logger.warning("circuit for tool %s open after %d failures", tool, failures)
            state = BreakerState(tool, failures, opened_at)
        else:
            return
        self.states[tool] = state
        if self.store is not None:
            try:
                await self.store.save_breaker(state)
            except StoreError as exc:  # the breaker still works in memory
                logger.error("cannot persist the circuit breaker of tool %s: %s", tool, exc)


class _Admission:
    """Whether an attempt of a step may start: its tool's breaker, then the plan's budget.

    Holds the run's budget account (what the revision, and the ones before it, spent).
    """

    __slots__ = ("breakers", "budget", "clock", "spent_calls", "spent_cost", "started_at", "tools")

    def __init__(
        self,
        budget: Budget | None,
        breakers: _Breakers,
        tools: ToolRunner,
        clock: Callable[[], float],
    ) -> None:
        self.budget = budget
        self.breakers = breakers
        self.tools = tools
        self.clock = clock
        self.started_at: float | None = None
        self.spent_calls = 0
        self.spent_cost = 0.0

    def resume(self, started_at: float | None, spent_calls: int, spent_cost: float) -> None:
        """Continue the account a journal recorded (a resumed run, or a new revision)."""
        self.started_at = started_at
        self.spent_calls = spent_calls
        self.spent_cost = spent_cost

    def start(self) -> float:
        """The run starts: the wall-time budget counts from its first start; returns now."""
        now = self.clock()
        if self.started_at is None:
            self.started_at = now
        return now

    def admit(self, step: Step, key: str = "") -> tuple[str, bool, float | None]:
        """Check the breaker and reserve the budget for one attempt of ``step`` (of its item
        ``key``, for a map).

        Returns:
            ``("", False, cost)`` when the attempt may start (``cost``: the cost units reserved,
            ``None`` without a budget); otherwise ``(why, exhausted, None)`` with ``exhausted``
            True for a budget that ran out.
        """
        breakers = self.breakers
        tool = tool_of(step)
        if tool is not None and breakers.states:
            denial = breakers.denial(tool)
            if denial:
                return denial, False, None
        budget = self.budget
        if budget is None:
            return "", False, None
        cost = 1.0
        if tool is not None:
            cost = float(self.tools.cost(tool))
        key = key or step.id
        if budget.wall_time_s is not None and self.started_at is not None:
            used = self.clock() - self.started_at
            if used >= budget.wall_time_s:
                return (
                    f"budget exhausted: wall time {used:.1f}s/{budget.wall_time_s:g}s used; "
                    f"step {key!r} not started",
                    True,
                    None,
                )
        if budget.tool_calls is not None and self.spent_calls + 1 > budget.tool_calls:
            return (
                f"budget exhausted: tool_calls {self.spent_calls}/{budget.tool_calls} used; "
                f"step {key!r} needs 1 more",
                True,
                None,
            )
        if budget.cost_units is not None and self.spent_cost + cost > budget.cost_units + 1e-9:
            return (
                f"budget exhausted: cost_units {self.spent_cost:g}/{budget.cost_units:g} used; "
                f"step {key!r} needs {cost:g} more",
                True,
                None,
            )
        self.spent_calls += 1
        self.spent_cost += cost
        return "", False, cost

    def remaining(self) -> Budget | None:
        """What is left of the budget (for a nested plan, which spends from it); ``None``
        without a budget."""
        budget = self.budget
        if budget is None:
            return None
        wall = budget.wall_time_s
        if wall is not None and self.started_at is not None:
            wall = max(wall - (self.clock() - self.started_at), 1e-3)
        return Budget(
            wall_time_s=wall,
            tool_calls=None
            if budget.tool_calls is None
            else max(budget.tool_calls - self.spent_calls, 0),
            cost_units=None
            if budget.cost_units is None
            else max(budget.cost_units - self.spent_cost, 0.0),
        )

    def charge(self, calls: int, cost: float) -> None:
        """Add what a nested plan spent to this plan's account."""
        self.spent_calls += calls
        self.spent_cost += cost
