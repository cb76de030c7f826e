"""``RunPlan`` sent again: a client's retry of the same request (its caller and request id) runs
nothing again; it waits for, and answers with, the run the first call started, whose failure is
the plan's, not the transport's.

The repro of issue 31's first break: a plan whose second step fails transiently three times.
Its first answer was ``UNAVAILABLE``, so the operator's client sent the request again, and the
agent started revision 2, ran the finished first step again and answered ``running``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import Agent, StrategicPlan, StrategicPlanner, ToolRegistry, tool
from stratagem.planning import SqliteStateStore, TransientError
from stratagem.protocol import (
    AbortedError,
    AnalyzeNarrativeResponse,
    CallContext,
    FailedPreconditionError,
    InvalidArgumentError,
    RemoteError,
    UnavailableError,
)

RAN: list[str] = []
RELEASE: dict[str, asyncio.Event] = {}
WAITING: asyncio.Queue[str] = asyncio.Queue()


@tool
async def note(text: str) -> AnalyzeNarrativeResponse:
    """Record that it ran (the plan's first step: an effect that must not happen twice)."""
    RAN.append(text)
    return AnalyzeNarrativeResponse(protagonist=text)


@tool
async def flaky(text: str) -> AnalyzeNarrativeResponse:
    """Fail transiently, as an MCP tool slower than its call timeout does; or wait for
    ``RELEASE[text]`` and succeed."""
    RAN.append(f"flaky {text}")
    if text in RELEASE:
        WAITING.put_nowait(text)
        await RELEASE[text].wait()
        return AnalyzeNarrativeResponse(protagonist=text)
    raise TransientError(f"{text}: the tool did not answer within its call timeout")


def _agent(store: SqliteStateStore | None = None) -> Agent:
    registry = ToolRegistry("strategic")
    registry.register(note)
    registry.register(flaky)
    return Agent("strategic", registry, StrategicPlan, StrategicPlanner(), store=store)


def _plan(plan_id: str, second: str = "down") -> str:
    retry: dict[str, Any] = {"max_attempts": 3, "initial_backoff_s": 0.0, "max_backoff_s": 0.0}
    return json.dumps(
        {
            "id": plan_id,
            "owner": "strategic",
            "goal": "note, then ask a slow tool",
            "steps": [
                {"kind": "tool", "id": "first", "tool": "note", "input": {"text": plan_id}},
                {
                    "kind": "tool",
                    "id": "second",
                    "tool": "flaky",
                    "depends_on": ["first"],
                    "input": {"text": second},
                    "retry": retry,
                },
            ],
        }
    )


def _ctx(request_id: str) -> CallContext:
    return CallContext(
        caller="operator", target="strategic", capability="RunPlan", request_id=request_id
    )


@pytest.fixture(autouse=True)
def _clean() -> None:
    global WAITING  # a queue binds to the event loop of its first wait: one per test
    RAN.clear()
    RELEASE.clear()
    WAITING = asyncio.Queue()


async def test_a_retried_run_plan_runs_nothing_again_and_answers_the_plans_failure(
    tmp_path: Path,
) -> None:
    store = SqliteStateStore(tmp_path / "plans.db")
    await store.start()
    agent = _agent(store)
    try:
        # The plan's failure is not the transport's: not UNAVAILABLE, which clients retry.
        with pytest.raises(AbortedError, match=r"step 'second' failed \(transient\)") as first:
            await agent.run_plan(_plan("flaky-run"), _ctx("run-1"), until_blocked=True)
        assert not isinstance(first.value, UnavailableError)
        assert RAN == ["flaky-run", "flaky down", "flaky down", "flaky down"]
        # The client sends the same request again: the same answer, nothing runs.
        with pytest.raises(AbortedError) as again:
            await agent.run_plan(_plan("flaky-run"), _ctx("run-1"), until_blocked=True)
        assert again.value.message == first.value.message
        assert len(RAN) == 4
    finally:
        await agent.aclose()
    # After a restart, from the store.
    restarted = _agent(store)
    try:
        with pytest.raises(AbortedError) as after:
            await restarted.run_plan(_plan("flaky-run"), _ctx("run-1"), until_blocked=True)
        assert after.value.message == first.value.message
        assert len(RAN) == 4
        state = await store.load("flaky-run")
        assert state is not None
        assert state.revision == 1
        # Another request with the same plan is another run: a new revision (its tool's
        # circuit is open by now: the failure is the circuit's).
        with pytest.raises(RemoteError):
            await restarted.run_plan(_plan("flaky-run"), _ctx("run-2"), until_blocked=True)
        state = await store.load("flaky-run")
        assert state is not None
        assert state.revision == 2
        assert RAN.count("flaky-run") == 2
    finally:
        await restarted.aclose()
        await store.aclose()


async def test_a_retry_while_the_plan_runs_joins_it() -> None:
    agent = _agent()
    RELEASE["slow"] = asyncio.Event()
    try:
        first = asyncio.ensure_future(agent.run_plan(_plan("slow-run", "slow"), _ctx("run-1")))
        assert await asyncio.wait_for(WAITING.get(), 10) == "slow"
        # Before: FAILED_PRECONDITION "already running here", though it is the same request.
        again = asyncio.ensure_future(agent.run_plan(_plan("slow-run", "slow"), _ctx("run-1")))
        await asyncio.sleep(0.05)
        assert not again.done()
        RELEASE["slow"].set()
        answers = await asyncio.wait_for(asyncio.gather(first, again), 10)
        assert [answer.status for answer in answers] == ["succeeded", "succeeded"]
        assert [answer.revision for answer in answers] == [1, 1]
        assert RAN == ["slow-run", "flaky slow"]
        # Another request for a plan that runs is still refused.
        RELEASE["slow"] = asyncio.Event()
        third = asyncio.ensure_future(agent.run_plan(_plan("slow-run", "slow"), _ctx("run-3")))
        assert await asyncio.wait_for(WAITING.get(), 10) == "slow"
        with pytest.raises(FailedPreconditionError, match="already running"):
            await agent.run_plan(_plan("slow-run", "slow"), _ctx("run-4"))
        RELEASE["slow"].set()
        assert (await asyncio.wait_for(third, 10)).revision == 2
    finally:
        RELEASE.get("slow", asyncio.Event()).set()
        await agent.aclose()


async def test_a_refused_plan_sent_again_is_refused_again(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "plans.db")
    await store.start()
    agent = _agent(store)
    cyclic = json.loads(_plan("cyclic"))
    cyclic["steps"][0]["depends_on"] = ["second"]
    try:
        for _ in range(2):
            with pytest.raises(InvalidArgumentError, match="cycle"):
                await agent.run_plan(json.dumps(cyclic), _ctx("run-1"), until_blocked=True)
        assert RAN == []
    finally:
        await agent.aclose()
        await store.aclose()


async def test_a_retry_of_a_plan_waiting_at_a_gate_answers_blocked() -> None:
    agent = _agent()
    gated = {
        "id": "gated-run",
        "owner": "strategic",
        "goal": "wait for a yes",
        "steps": [
            {"kind": "gate", "id": "ok", "prompt": "Go on?"},
            {
                "kind": "tool",
                "id": "after",
                "tool": "note",
                "input": {"text": "after"},
                "depends_on": ["ok"],
            },
        ],
    }
    try:
        first = await agent.run_plan(json.dumps(gated), _ctx("run-1"), until_blocked=True)
        # Before: FAILED_PRECONDITION "already running here" (the plan waits at its gate).
        again = await agent.run_plan(json.dumps(gated), _ctx("run-1"), until_blocked=True)
        assert (first.status, again.status) == ("blocked", "blocked")
        assert (first.revision, again.revision) == (1, 1)
        assert RAN == []
    finally:
        await agent.aclose()
