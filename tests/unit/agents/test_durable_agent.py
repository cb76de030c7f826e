"""Agents with a state store: gates, pause, cancel, resume, and resuming after a crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import Agent, ToolRegistry, tool
from stratagem.planning import (
    GateStep,
    Plan,
    PlanResult,
    PlanStatus,
    SqliteStateStore,
    StateStore,
    ToolContext,
    ToolStep,
)
from stratagem.protocol import (
    CallContext,
    ControlRequest,
    FailedPreconditionError,
    NotFoundError,
    WireModel,
)


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("these tests submit their plans")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("these tests submit their plans")


class Ledger:
    """Effects of the side-effecting tool, one entry per execution; ``hold`` makes it wait."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.entered = asyncio.Event()


def _agent(store: StateStore | None, ledger: Ledger) -> Agent:
    registry = ToolRegistry("strategic")

    @tool(name="charge", idempotent=False)
    async def charge(key: str, ctx: ToolContext) -> dict[str, str]:
        """Apply an effect once per call (not idempotent)."""
        ledger.entered.set()
        await ledger.hold.wait()
        ledger.entries.append(f"{ctx.plan_id} {ctx.step_id}")
        return {"key": key}

    @tool(name="look")
    async def look(key: str) -> dict[str, str]:
        """Read something (idempotent)."""
        return {"key": key}

    registry.register(charge)
    registry.register(look)
    return Agent("strategic", registry, Plan, _NoPlanner(), store=store)


def _plan(plan_id: str, *, gate: bool = False) -> Plan:
    steps: list[Any] = [ToolStep(id="a", tool="look", input={"key": "a"})]
    if gate:
        steps.append(GateStep(id="g", prompt="go on?", depends_on=["a"]))
    steps.append(
        ToolStep(id="b", tool="charge", input={"key": "b"}, depends_on=["g" if gate else "a"])
    )
    return Plan(id=plan_id, owner="strategic", goal="test", steps=steps)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStateStore]:
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as opened:
        yield opened


async def _until(agent: Agent, plan_id: str, status: PlanStatus) -> None:
    """Wait for the plan's own event of ``status`` (stored ones count)."""
    async for event in agent.watch(plan_id):
        if event.plan_id == plan_id and not event.step_id and event.status == status.value:
            return


def test_registry_says_which_tools_are_idempotent() -> None:
    agent = _agent(None, Ledger())
    assert agent.registry.is_idempotent("look")
    assert not agent.registry.is_idempotent("charge")
    assert not agent.registry.is_idempotent("unknown")


async def test_a_gate_blocks_until_approved_over_control(store: SqliteStateStore) -> None:
    ledger = Ledger()
    agent = _agent(store, ledger)
    run = asyncio.create_task(agent.submit_plan(_plan("gated", gate=True)))
    await _until(agent, "gated", PlanStatus.BLOCKED)
    ctx = CallContext(
        caller="operator", target="strategic", capability="Control.approve", request_id="c1"
    )
    request = ControlRequest(plan_id="gated", action="approve", gate_id="g", rationale="fine")
    await agent.control(request, ctx)
    result = await run
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["g"]["approver"] == "operator"
    assert ledger.entries == ["gated b"]
    with pytest.raises(FailedPreconditionError):
        await agent.decide_gate("gated", "g", approve=True, approver="operator", rationale="again")


async def test_control_of_an_unknown_plan_is_not_found(store: SqliteStateStore) -> None:
    agent = _agent(store, Ledger())
    with pytest.raises(NotFoundError):
        await agent.pause("nope")
    with pytest.raises(NotFoundError):
        await agent.resume("nope")


async def test_pause_then_resume_and_cancel(store: SqliteStateStore) -> None:
    ledger = Ledger()
    agent = _agent(store, ledger)
    run = asyncio.create_task(agent.submit_plan(_plan("paused", gate=True)))
    await _until(agent, "paused", PlanStatus.BLOCKED)
    await agent.pause("paused")
    assert (await run).status is PlanStatus.PAUSED
    with pytest.raises(FailedPreconditionError):
        await agent.decide_gate(
            "paused", "g", approve=True, approver="op", rationale="", revision=7
        )
    resumed = await agent.resume("paused")
    assert resumed.plan_id == "paused"
    await _until(agent, "paused", PlanStatus.BLOCKED)
    snapshot = await agent.cancel("paused")
    await _until(agent, "paused", PlanStatus.CANCELLED)
    assert snapshot.plan_id == "paused"
    assert ledger.entries == []
    with pytest.raises(FailedPreconditionError):
        await agent.resume("paused")


async def test_a_restarted_agent_resumes_its_plans_and_reconciles_the_step_in_flight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plans.sqlite3"
    ledger = Ledger()
    ledger.hold.clear()
    async with SqliteStateStore(path) as first:
        agent = _agent(first, ledger)
        run = asyncio.create_task(agent.submit_plan(_plan("crash")))
        await ledger.entered.wait()
        run.cancel()  # the process dies while "b" is in flight
        with pytest.raises(asyncio.CancelledError):
            await run
    ledger.hold.set()
    async with SqliteStateStore(path) as second:
        restarted = _agent(second, ledger)
        assert await restarted.resume_unfinished() == ["crash"]
        await _until(restarted, "crash", PlanStatus.BLOCKED)
        [snapshot] = restarted.plans("crash")
        assert '"status":"blocked"' in snapshot.plan_json
        # The ledger has no entry for "b": its effect did not happen, so run it again.
        await restarted.decide_gate(
            "crash", "b", approve=True, approver="operator", rationale="not charged"
        )
        await _until(restarted, "crash", PlanStatus.SUCCEEDED)
        await restarted.aclose()
    assert ledger.entries == ["crash b"]


async def test_a_paused_plan_stays_paused_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "plans.sqlite3"
    ledger = Ledger()
    async with SqliteStateStore(path) as first:
        agent = _agent(first, ledger)
        run = asyncio.create_task(agent.submit_plan(_plan("held", gate=True)))
        await _until(agent, "held", PlanStatus.BLOCKED)
        await agent.pause("held")
        await run
    async with SqliteStateStore(path) as second:
        restarted = _agent(second, ledger)
        assert await restarted.resume_unfinished() == []
        assert [s.status for s in restarted.plans("held")] == ["paused"]
        # A decision may be given while it is paused; resume acts on it.
        await restarted.decide_gate("held", "g", approve=True, approver="op", rationale="go")
        await restarted.resume("held")
        await _until(restarted, "held", PlanStatus.SUCCEEDED)
    assert ledger.entries == ["held b"]
