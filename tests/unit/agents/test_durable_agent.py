"""Agents with a state store: gates, pause, cancel, resume, and resuming after a crash."""

from __future__ import annotations

import asyncio
import time
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
        agent.closing()  # the process stops while "b" is in flight: an interruption
        run.cancel()
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


@pytest.mark.parametrize(("approve", "final"), [(True, PlanStatus.SUCCEEDED), (False, None)])
async def test_a_decision_continues_a_plan_whose_runner_is_gone(
    store: SqliteStateStore, approve: bool, final: PlanStatus | None
) -> None:
    # `plans run` with a deadline: the call (and the run serving it) ends while the plan waits.
    ledger = Ledger()
    agent = _agent(store, ledger)
    run = asyncio.create_task(agent.submit_plan(_plan("orphan", gate=True)))
    await _until(agent, "orphan", PlanStatus.BLOCKED)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await agent.decide_gate("orphan", "g", approve=approve, approver="operator", rationale="ok")
    # The decision alone carries the plan on: no `resume` is needed.
    wanted = final or PlanStatus.FAILED

    async def settled() -> PlanStatus | None:
        while True:
            state = await store.load("orphan")
            if state is not None and state.status.is_final:
                return state.status
            await asyncio.sleep(0.01)

    assert await asyncio.wait_for(settled(), timeout=30) is wanted
    assert ledger.entries == (["orphan b"] if approve else [])


# --- no zombie work ------------------------------------------------------------------------------


async def _step_running(agent: Agent, plan_id: str, step_id: str) -> None:
    async for event in agent.watch(plan_id):
        if event.step_id == step_id and event.status == "running":
            return


async def _stored_deadline(path: Path, plan_id: str) -> float:
    async with SqliteStateStore(path) as store:
        state = await store.load(plan_id)
    assert state is not None
    deadline = state.plan(Plan).deadline
    assert deadline is not None
    return deadline


def _call_until(deadline_s: float) -> CallContext:
    """A call as the server serves it, whose caller waits ``deadline_s`` more seconds."""
    return CallContext(
        caller="operator",
        target="strategic",
        capability="RunPlan",
        request_id="r",
        deadline=time.monotonic() + deadline_s,
    )


async def _settled(agent: Agent, plan_id: str) -> None:
    task = agent._runs.task(plan_id)
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)


async def test_a_plan_whose_caller_is_gone_is_cancelled_not_left_running(
    store: SqliteStateStore,
) -> None:
    ledger = Ledger()
    ledger.hold.clear()
    agent = _agent(store, ledger)
    plan = _plan("abandoned").model_dump_json()
    # The server's deadline on the handler: the caller stops waiting while "b" runs.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(agent.run_plan(plan, _call_until(30)), 0.2)
    await _settled(agent, "abandoned")
    state = await store.load("abandoned")
    assert state is not None
    assert state.status is PlanStatus.CANCELLED
    assert state.plan(Plan).deadline is not None  # the caller's deadline, recorded with it
    assert [s.status for s in agent.plans("abandoned")] == ["cancelled"]
    ledger.hold.set()
    assert ledger.entries == []
    # Nothing is left to resume after a restart.
    assert await _agent(store, ledger).resume_unfinished() == []


async def test_a_call_cut_by_the_agent_stopping_interrupts_its_plan(
    store: SqliteStateStore,
) -> None:
    ledger = Ledger()
    ledger.hold.clear()
    agent = _agent(store, ledger)
    run = asyncio.create_task(agent.run_plan(_plan("stopped").model_dump_json(), _call_until(30)))
    await ledger.entered.wait()
    agent.closing()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    state = await store.load("stopped")
    assert state is not None
    assert state.status is PlanStatus.RUNNING  # resumable: its caller may still be waiting


async def test_after_a_restart_only_plans_with_a_waiting_caller_are_resumed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plans.sqlite3"
    ledger = Ledger()
    ledger.hold.clear()
    async with SqliteStateStore(path) as first:
        agent = _agent(first, ledger)
        runs = {
            name: asyncio.create_task(agent.run_plan(_plan(name).model_dump_json(), call))
            for name, call in (
                ("expired", _call_until(0.5)),
                ("waited-for", _call_until(600)),
            )
        }
        for name in runs:
            await _step_running(agent, name, "b")
        agent.closing()  # the process stops: both interrupted, both still running in the store
        for run in runs.values():
            run.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
        for name in runs:
            state = await first.load(name)
            assert state is not None
            assert state.status is PlanStatus.RUNNING
    expired = await _stored_deadline(path, "expired")
    # The first caller's deadline passes while the agent is down.
    await asyncio.sleep(max(0.0, expired - time.time()) + 0.01)
    ledger.hold.set()
    async with SqliteStateStore(path) as second:
        restarted = _agent(second, ledger)
        assert await restarted.resume_unfinished() == ["waited-for"]
        await _settled(restarted, "expired")
        expired = await second.load("expired")
        assert expired is not None
        assert expired.status is PlanStatus.CANCELLED
        await restarted.aclose()


async def test_resuming_nothing_cancels_running_plans_and_leaves_gated_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plans.sqlite3"
    ledger = Ledger()
    ledger.hold.clear()
    async with SqliteStateStore(path) as first:
        agent = _agent(first, ledger)
        running = asyncio.create_task(
            agent.run_plan(_plan("busy").model_dump_json(), _call_until(600))
        )
        gated = asyncio.create_task(agent.submit_plan(_plan("gated", gate=True)))
        await ledger.entered.wait()
        await _until(agent, "gated", PlanStatus.BLOCKED)
        agent.closing()
        for run in (running, gated):
            run.cancel()
        await asyncio.gather(running, gated, return_exceptions=True)
    ledger.hold.set()
    async with SqliteStateStore(path) as second:
        # `secret rotate`: the agents are new, the callers of their plans are gone.
        redeployed = _agent(second, ledger)
        assert await redeployed.resume_unfinished(resume=False) == []
        await _settled(redeployed, "busy")
        busy = await second.load("busy")
        assert busy is not None
        assert busy.status is PlanStatus.CANCELLED
        assert [s.status for s in redeployed.plans("busy")] == ["cancelled"]
        held = await second.load("gated")
        assert held is not None
        assert held.status is PlanStatus.BLOCKED  # still waiting for its decision
        await redeployed.decide_gate("gated", "g", approve=True, approver="op", rationale="go")
        await _until(redeployed, "gated", PlanStatus.SUCCEEDED)
        await redeployed.aclose()
    assert ledger.entries == ["gated b"]
