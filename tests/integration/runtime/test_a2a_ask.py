"""A goal in plain words sent to the orchestrator's A2A face: a ``SendMessage`` whose skill is
``AskGoal`` and whose text is the goal (docs/goals.md). The orchestrator is a real gRPC server with
its A2A face on 127.0.0.1; it reaches the example domain's agents (weather, timer) in memory; the
message is sent by a plan's ``a2a`` step (``runtime.A2ADispatcher``), as any A2A client would."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.agents import ToolRegistry, build_in_memory
from stratagem.agents._a2a import A2ADispatcher
from stratagem.planning import CrossAgentStep, Engine, InMemoryDispatcher, Plan, PlanStatus
from stratagem.protocol import (
    A2AConfig,
    A2AServer,
    AgentServer,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
)
from stratagem.protocol._a2a._client import A2APeerConfig
from tests.unit._registry import registries_kept

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[3]
SEED = "check the weather in Seattle and set a timer for 10 minutes"


@pytest.fixture(autouse=True)
def _kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with registries_kept():
        yield


async def test_a_goal_sent_over_a2a_is_planned_and_answered() -> None:
    agents, _ = build_in_memory(
        ["orchestrator", "weather", "timer", "calendar"],
        extensions=["examples.extensions.assistant"],
        entry_points=False,
    )
    orchestrator = agents["orchestrator"]
    signer = TokenSigner(ClusterSecret.generate())
    server = AgentServer(
        orchestrator,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(signer),
        audit=InMemoryAuditLog(),
        config=ServerConfig(grace_s=1.0),
    )
    await server.start()
    a2a = A2AServer(server, orchestrator, A2AConfig())
    await a2a.start()
    peer = A2APeerConfig("assistant", a2a.url, skill="AskGoal", token=signer.issue("operator", 600))
    dispatcher = A2ADispatcher(
        InMemoryDispatcher(),
        caller="orchestrator",
        peers={"assistant": peer},
        policy=Policy.default(),
        audit=InMemoryAuditLog(),
    )
    engine = Engine(tools=ToolRegistry("orchestrator"), dispatcher=dispatcher, agent="orchestrator")
    plan = Plan(
        id="ask-over-a2a",
        owner="orchestrator",
        goal="ask the assistant",
        steps=[
            CrossAgentStep(
                id="ask",
                target="a2a",
                capability="SendA2AMessage",
                request={"agent": "assistant", "text": SEED},
            )
        ],
    )
    try:
        result = await engine.run(plan)
    finally:
        await dispatcher.aclose()
        await a2a.aclose()
        await server.aclose()
        for agent in agents.values():
            await agent.aclose()
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    answer = result.outputs["ask"]["data"]
    assert answer["status"] == "succeeded"
    assert [(s["agent"], s["capability"], s["status"]) for s in answer["steps"]] == [
        ("weather", "GetWeather", "succeeded"),
        ("timer", "SetTimer", "succeeded"),
    ]
    assert json.loads(answer["steps"][0]["requestJson"]) == {"city": "Seattle"}
    assert answer["summary"].startswith("done: check the weather in Seattle: Seattle: 52°F")
