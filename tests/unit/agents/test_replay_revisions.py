"""An agent's store serves replay and the revision history; ``replan`` makes a new revision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import Agent, ToolRegistry, tool
from stratagem.planning import Plan, PlanResult, PlanStatus, SqliteStateStore, StateStore, ToolStep
from stratagem.protocol import (
    CallContext,
    ControlRequest,
    FailedPreconditionError,
    NotFoundError,
    WireModel,
)

OPERATOR_CTX = CallContext(caller="operator", target="strategic", capability="", request_id="c1")


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("these tests submit their plans")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("these tests submit their plans")


def _agent(store: StateStore, ledger: list[str]) -> Agent:
    registry = ToolRegistry("strategic")

    @tool(name="count", idempotent=False)
    async def count(key: str) -> dict[str, Any]:
        """Count a side effect."""
        ledger.append(key)
        return {"key": key, "n": len(ledger)}

    registry.register(count)
    return Agent("strategic", registry, Plan, _NoPlanner(), store=store)


def _plan(*keys: str) -> Plan:
    steps: list[Any] = []
    for i, key in enumerate(keys):
        depends = [steps[-1].id] if steps else []
        steps.append(ToolStep(id=f"s{i}", tool="count", input={"key": key}, depends_on=depends))
    return Plan(id="p1", owner="strategic", goal="count", steps=steps)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStateStore]:
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as opened:
        yield opened


async def test_replay_of_an_unchanged_plan_finds_no_divergence(store: SqliteStateStore) -> None:
    ledger: list[str] = []
    agent = _agent(store, ledger)
    result = await agent.submit_plan(_plan("a", "b", "c"))
    assert result.status is PlanStatus.SUCCEEDED
    report = await _agent(store, ledger).replay("p1")
    assert report.divergences == []
    assert report.decisions == 3 * 4 + 1
    assert report.recorded_status == report.replayed_status == "succeeded"
    assert ledger == ["a", "b", "c"]  # nothing ran again


async def test_replay_with_a_substituted_output_diverges_at_its_step(
    store: SqliteStateStore,
) -> None:
    ledger: list[str] = []
    agent = _agent(store, ledger)
    await agent.submit_plan(_plan("a", "b"))
    report = await agent.replay("p1", outputs={"s1": {"result": {"key": "z", "n": 9}}})
    assert [(d.step_id, d.decision) for d in report.divergences] == [("s1", "output")]
    assert ledger == ["a", "b"]


async def test_replay_refuses_unknown_and_unfinished_plans(store: SqliteStateStore) -> None:
    agent = _agent(store, [])
    with pytest.raises(NotFoundError):
        await agent.replay("nope")


async def test_replan_makes_a_revision_the_history_lists(store: SqliteStateStore) -> None:
    ledger: list[str] = []
    agent = _agent(store, ledger)
    await agent.submit_plan(_plan("a", "b"))
    new = _plan("a", "b", "c").model_dump_json()
    snapshot = await agent.control(
        ControlRequest(plan_id="p1", action="replan", plan_json=new, rationale="one more"),
        OPERATOR_CTX,
    )
    assert snapshot.revision == 2
    history = await agent.revisions("p1")
    assert [(r.revision, r.parent) for r in history.revisions] == [(1, 0), (2, 1)]
    second = history.revisions[1]
    assert second.author == "operator"
    assert second.rationale == "one more"
    assert second.added == ["s2"]
    assert second.removed == []
    assert sorted(second.carried) == ["s0", "s1"]
    resumed = await agent.control(ControlRequest(plan_id="p1", action="resume"), OPERATOR_CTX)
    assert resumed.revision == 2
    await agent.aclose()


async def test_replan_refuses_a_plan_outside_the_registry(store: SqliteStateStore) -> None:
    agent = _agent(store, [])
    await agent.submit_plan(_plan("a"))
    bad = Plan(
        id="p1", owner="strategic", goal="x", steps=[ToolStep(id="s0", tool="missing", input={})]
    )
    with pytest.raises(FailedPreconditionError, match="missing"):
        await agent.replan("p1", bad.model_dump_json(), rationale="r", author="operator")
    with pytest.raises(NotFoundError):
        await agent.revisions("nope")
