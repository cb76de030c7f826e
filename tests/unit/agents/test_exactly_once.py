"""A durable agent answers a repeated request from its store: the plan's effects happen once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import Agent, ToolRegistry, tool
from stratagem.planning import Plan, PlanResult, PlanStatus, SqliteStateStore, StateStore, ToolStep
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    CallContext,
    FailedPreconditionError,
    WireModel,
)

CAPABILITY = "AnalyzeNarrative"


class _Planner:
    """One side-effecting step; the response is built from its output."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        assert isinstance(request, AnalyzeNarrativeRequest)
        step = ToolStep(id="effect", tool="effect", input={"text": request.text})
        return Plan(id=plan_id, owner="strategic", goal="analyze", steps=[step])

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        output = result.outputs["effect"]["result"]
        return AnalyzeNarrativeResponse(protagonist=output["who"], summary=f"run {output['n']}")


def _agent(store: StateStore, ledger: list[str]) -> Agent:
    registry = ToolRegistry("strategic")

    @tool(name="effect", idempotent=False)
    async def effect(text: str) -> dict[str, Any]:
        """A side effect the test counts."""
        if text == "fail":
            raise ValueError("cannot analyze 'fail'")
        ledger.append(text)
        return {"who": text.split()[0], "n": len(ledger)}

    registry.register(effect)
    return Agent("strategic", registry, Plan, _Planner(), store=store)


def _ctx(request_id: str) -> CallContext:
    return CallContext(
        caller="orchestrator",
        target="strategic",
        capability=CAPABILITY,
        request_id=request_id,
        plan_id="goal-1",
        step_id="analyze",
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStateStore]:
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as opened:
        yield opened


async def test_a_repeated_request_is_answered_from_the_store_without_running_again(
    tmp_path: Path, store: SqliteStateStore
) -> None:
    ledger: list[str] = []
    request = AnalyzeNarrativeRequest(text="mira climbs the tower")
    first = await _agent(store, ledger).handle(CAPABILITY, request, _ctx("r1"))
    # The agent dies before the server stores the answer: a new agent on the same store gets the
    # caller's retry (a new request id even: the plan id is the caller's plan and step).
    again = await _agent(store, ledger).handle(CAPABILITY, request, _ctx("r1"))
    assert again == first
    assert ledger == ["mira climbs the tower"]
    state = await store.load("goal-1/analyze")
    assert state is not None
    assert state.revision == 1
    assert state.status is PlanStatus.SUCCEEDED


async def test_the_same_plan_id_with_a_different_request_is_refused(
    store: SqliteStateStore,
) -> None:
    ledger: list[str] = []
    agent = _agent(store, ledger)
    await agent.handle(CAPABILITY, AnalyzeNarrativeRequest(text="mira waits"), _ctx("r1"))
    with pytest.raises(FailedPreconditionError, match="different request"):
        await agent.handle(CAPABILITY, AnalyzeNarrativeRequest(text="tomas runs"), _ctx("r2"))
    assert ledger == ["mira waits"]


async def test_a_failed_plan_runs_again_for_its_retry(store: SqliteStateStore) -> None:
    ledger: list[str] = []
    agent = _agent(store, ledger)
    request = AnalyzeNarrativeRequest(text="fail")
    with pytest.raises(FailedPreconditionError):
        await agent.handle(CAPABILITY, request, _ctx("r1"))
    retried = AnalyzeNarrativeRequest(text="mira again")
    response = await agent.handle(CAPABILITY, retried, _ctx("r2"))
    assert isinstance(response, AnalyzeNarrativeResponse)
    assert response.protagonist == "mira"
    state = await store.load("goal-1/analyze")
    assert state is not None
    assert state.revision == 2
