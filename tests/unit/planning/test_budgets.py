"""Budgets (reserved before dispatch, checkpointed) and per-tool circuit breakers (persisted)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    Budget,
    CircuitBreakerConfig,
    Engine,
    EngineConfig,
    FailureClass,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanStatus,
    RetryPolicy,
    SqliteStateStore,
    StepFailure,
    StepStatus,
    ToolContext,
    ToolStep,
    TransientError,
)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Runner:
    """A ToolRunner with costs, idempotency and a ledger of the calls that reached a tool."""

    def __init__(
        self,
        *,
        costs: dict[str, float] | None = None,
        failing: set[str] | None = None,
        clock: Clock | None = None,
        tick_s: float = 0.0,
    ) -> None:
        self.ledger: Counter[str] = Counter()
        self.costs = costs or {}
        self.failing = failing if failing is not None else set()
        self.clock = clock
        self.tick_s = tick_s
        self.hold: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}

    def cost(self, name: str) -> float:
        return self.costs.get(name, 1.0)

    def is_idempotent(self, name: str) -> bool:
        return True

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.ledger[ctx.step_id] += 1
        self.started.setdefault(ctx.step_id, asyncio.Event()).set()
        if self.clock is not None:
            self.clock.now += self.tick_s
        if ctx.step_id in self.hold:
            await self.hold[ctx.step_id].wait()
        if name in self.failing:
            raise TransientError(f"{name} is down")
        return {"step": ctx.step_id}


def chain(n: int, *, budget: Budget | None = None, tool: str = "work", pid: str = "b1") -> Plan:
    steps = [
        ToolStep(id=f"s{i}", tool=tool, depends_on=[f"s{i - 1}"] if i else []) for i in range(n)
    ]
    return Plan(id=pid, owner="tactical", goal="spend", steps=steps, budget=budget)


async def test_tool_calls_run_out_before_dispatch_with_a_policy_failure() -> None:
    runner = Runner()
    engine = Engine(tools=runner, agent="tactical")
    result = await engine.run(chain(5, budget=Budget(tool_calls=3)))
    assert result.status is PlanStatus.FAILED
    assert result.failures == [
        StepFailure(
            "s3",
            FailureClass.POLICY,
            "budget exhausted: tool_calls 3/3 used; step 's3' needs 1 more",
            0,
        )
    ]
    assert runner.ledger == Counter({"s0": 1, "s1": 1, "s2": 1})  # s3 never started
    assert result.statuses["s3"] is StepStatus.FAILED
    assert result.statuses["s4"] is StepStatus.SKIPPED


async def test_cost_units_come_from_the_runner() -> None:
    runner = Runner(costs={"pricey": 2.5})
    engine = Engine(tools=runner, agent="tactical")
    result = await engine.run(chain(3, budget=Budget(cost_units=6.0), tool="pricey"))
    assert result.failures[0].message == (
        "budget exhausted: cost_units 5/6 used; step 's2' needs 2.5 more"
    )
    assert runner.ledger == Counter({"s0": 1, "s1": 1})


async def test_retries_reserve_too() -> None:
    runner = Runner(failing={"flaky"})
    engine = Engine(
        EngineConfig(circuit_breaker=None), tools=runner, agent="tactical", sleep=_no_sleep
    )
    plan = Plan(
        id="b2",
        owner="tactical",
        goal="spend",
        budget=Budget(tool_calls=2),
        steps=[ToolStep(id="s0", tool="flaky", retry=RetryPolicy(max_attempts=5))],
    )
    result = await engine.run(plan)
    assert runner.ledger == Counter({"s0": 2})
    assert result.failures[0].failure_class is FailureClass.POLICY
    assert result.failures[0].message.startswith("budget exhausted: tool_calls 2/2 used")


async def test_wall_time_is_checked_when_a_step_is_about_to_start() -> None:
    clock = Clock()
    runner = Runner(clock=clock, tick_s=6.0)
    engine = Engine(tools=runner, agent="tactical", clock=clock)
    result = await engine.run(chain(4, budget=Budget(wall_time_s=10.0)))
    assert result.failures[0].message == (
        "budget exhausted: wall time 12.0s/10s used; step 's2' not started"
    )
    assert runner.ledger == Counter({"s0": 1, "s1": 1})


async def test_spent_amounts_survive_resume(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    runner = Runner()
    runner.hold["s2"] = asyncio.Event()  # s2 never finishes in the first run
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        task = asyncio.create_task(engine.run(chain(6, budget=Budget(tool_calls=4))))
        await runner.started.setdefault("s2", asyncio.Event()).wait()
        task.cancel()  # a crash: s2 was in flight
        await asyncio.gather(task, return_exceptions=True)
        state = await store.load("b1")
        assert state is not None
        assert state.spent_calls == 3
    del runner.hold["s2"]
    async with SqliteStateStore(path) as store:
        engine = Engine(tools=runner, agent="tactical", store=store)
        result = await engine.resume("b1")
    # s2 is re-run (idempotent) with the 4th call; without the recorded three, s3 would run.
    assert result.failures[0].message == (
        "budget exhausted: tool_calls 4/4 used; step 's3' needs 1 more"
    )
    assert runner.ledger == Counter({"s0": 1, "s1": 1, "s2": 2})


async def _no_sleep(delay: float) -> None:
    return None


async def test_a_breaker_opens_persists_and_resets_after_its_window(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    clock = Clock()
    runner = Runner(failing={"flaky"})
    config = EngineConfig(circuit_breaker=CircuitBreakerConfig(failure_threshold=3))
    retry3 = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)

    def flaky_plan(pid: str) -> Plan:
        step = ToolStep(id="call", tool="flaky", retry=retry3)
        return Plan(id=pid, owner="tactical", goal="trip", steps=[step])

    async with SqliteStateStore(path) as store:
        engine = Engine(config, tools=runner, agent="tactical", store=store, clock=clock)
        first = await engine.run(flaky_plan("t1"))
        assert first.failures[0].failure_class is FailureClass.TRANSIENT
        assert runner.ledger["call"] == 3
        second = await engine.run(flaky_plan("t2"))
        assert second.failures[0].failure_class is FailureClass.POLICY
        assert second.failures[0].message.startswith(
            "circuit open for tool 'flaky' after 3 failures; retry after "
        )
        assert runner.ledger["call"] == 3  # the tool was not called
    # A restart: a new engine on the same file still finds the breaker open.
    async with SqliteStateStore(path) as store:
        engine = Engine(config, tools=runner, agent="tactical", store=store, clock=clock)
        clock.now += 29.0
        third = await engine.run(flaky_plan("t3"))
        assert third.failures[0].failure_class is FailureClass.POLICY
        assert runner.ledger["call"] == 3
        clock.now += 2.0  # past reset_after_s: one call goes through, and the tool is back
        runner.failing.clear()
        fourth = await engine.run(flaky_plan("t4"))
        assert fourth.status is PlanStatus.SUCCEEDED
        assert runner.ledger["call"] == 4
        [breaker] = await store.breakers()
        assert (breaker.tool, breaker.failures, breaker.opened_at) == ("flaky", 0, None)


async def test_a_failure_while_half_open_opens_the_breaker_again() -> None:
    clock = Clock()
    runner = Runner(failing={"flaky"})
    store = InMemoryStateStore()
    config = EngineConfig(
        circuit_breaker=CircuitBreakerConfig(failure_threshold=2, reset_after_s=5)
    )
    engine = Engine(config, tools=runner, agent="tactical", store=store, clock=clock)
    one = ToolStep(id="call", tool="flaky", retry=RetryPolicy(max_attempts=1))

    def p(pid: str) -> Plan:
        return Plan(id=pid, owner="tactical", goal="trip", steps=[one])

    await engine.run(p("h1"))
    await engine.run(p("h2"))  # opens
    clock.now += 6
    half = await engine.run(p("h3"))  # half-open: called, fails, opens again
    assert half.failures[0].failure_class is FailureClass.TRANSIENT
    again = await engine.run(p("h4"))
    assert again.failures[0].failure_class is FailureClass.POLICY
    assert runner.ledger["call"] == 3
    [breaker] = await store.breakers()
    assert (breaker.failures, breaker.opened_at) == (3, clock.now)


async def test_a_policy_gate_holds_a_step_whose_breaker_is_open() -> None:
    clock = Clock()
    runner = Runner(failing={"flaky"})
    config = EngineConfig(circuit_breaker=CircuitBreakerConfig(failure_threshold=1))
    engine = Engine(config, tools=runner, agent="tactical", clock=clock)
    one = ToolStep(id="call", tool="flaky", retry=RetryPolicy(max_attempts=1))
    await engine.run(Plan(id="g1", owner="tactical", goal="trip", steps=[one]))
    gated = one.model_copy(update={"on_policy_failure": "gate"})
    task = asyncio.create_task(
        engine.run(Plan(id="g2", owner="tactical", goal="trip", steps=[gated]))
    )
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done()  # blocked at the gate, not failed
    runner.failing.clear()
    clock.now += 60
    await engine.decide("g2", "call", approve=True, approver="ops", rationale="fixed", revision=1)
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    assert runner.ledger["call"] == 2


class _RetryWithNewInput:
    """A replanner that gives the failed step another input (so it is 'changed')."""

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        steps = [
            s.model_copy(update={"input": {"again": True}}) if s.id == failure.step_id else s
            for s in plan.steps
            if isinstance(s, ToolStep)
        ]
        return plan.model_copy(update={"steps": steps})


class _FailsOnce(Runner):
    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if ctx.step_id == "s2" and not input.get("again"):
            self.ledger[ctx.step_id] += 1
            raise LogicError("s2 needs another input")
        return await super().run_tool(name, input, ctx)


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_new_revision_keeps_spending_from_the_plans_budget(
    kind: str, tmp_path: Path
) -> None:
    runner = _FailsOnce()
    store = SqliteStateStore(tmp_path / "state.db") if kind == "sqlite" else InMemoryStateStore()
    engine = Engine(tools=runner, agent="tactical", store=store, replanner=_RetryWithNewInput())
    result = await engine.run(chain(5, budget=Budget(tool_calls=4)))
    # Revision 1 reserved s0, s1 and the failed s2 (3 calls); revision 2 carries s0 and s1 over
    # and may reserve only 1 more: s2 again, then s3 is refused.
    assert result.submitted.revision == 2
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].message == (
        "budget exhausted: tool_calls 4/4 used; step 's3' needs 1 more"
    )
    assert runner.ledger == Counter({"s0": 1, "s1": 1, "s2": 2})
    state = await store.load("b1")
    assert state is not None
    assert (state.revision, state.spent_calls) == (2, 4)
    if isinstance(store, SqliteStateStore):
        await store.aclose()


async def test_a_resumed_plans_failures_never_open_a_breaker_for_other_plans() -> None:
    clock = Clock()
    runner = Runner(failing={"flaky"})
    store = InMemoryStateStore()
    config = EngineConfig(circuit_breaker=CircuitBreakerConfig(failure_threshold=2))
    retry3 = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    step = ToolStep(id="call", tool="flaky", retry=retry3)
    engine = Engine(config, tools=runner, agent="tactical", store=store, clock=clock)
    # A plan interrupted while its call is in flight (its process stopped) ...
    runner.hold["call"] = asyncio.Event()
    run = asyncio.create_task(
        engine.run(Plan(id="left", owner="tactical", goal="trip", steps=[step]))
    )
    await runner.started.setdefault("call", asyncio.Event()).wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    del runner.hold["call"]
    # ... resumed after a restart: its attempts 2 and 3 fail, enough to open the breaker.
    restarted = Engine(config, tools=runner, agent="tactical", store=store, clock=clock)
    resumed = await restarted.resume("left")
    assert resumed.failures[0].failure_class is FailureClass.TRANSIENT
    assert runner.ledger["call"] == 3
    # Another caller's plan still calls the tool: no breaker was opened by the resumed one.
    runner.failing.clear()
    fresh = await restarted.run(Plan(id="fresh", owner="tactical", goal="go", steps=[step]))
    assert fresh.status is PlanStatus.SUCCEEDED
    assert runner.ledger["call"] == 4
