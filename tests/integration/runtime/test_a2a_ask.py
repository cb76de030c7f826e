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

from stratagem.agents import ToolRegistry, build_agent, build_in_memory, serve_in_memory
from stratagem.agents._a2a import A2ADispatcher
from stratagem.planning import CrossAgentStep, Engine, InMemoryDispatcher, Plan, PlanStatus
from stratagem.protocol import (
    A2AConfig,
    A2AServer,
    AgentServer,
    AskGoalRequest,
    AskGoalResponse,
    CallContext,
    ClusterSecret,
    InMemoryAuditLog,
    InvalidArgumentError,
    Policy,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
)
from stratagem.protocol._a2a._client import A2AAgentClient, A2APeerConfig
from tests.integration.a2a_peer import EchoAgent
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


async def test_an_external_agents_card_examples_make_its_skill_plannable() -> None:
    """An external A2A agent configured for the orchestrator (``reviewer``: an ``a2a-sdk``
    agent whose ``echo`` skill lists examples on its card) is in the capability directory: a goal
    whose clause matches an example is sent to it over A2A, beside a deployed agent's step."""
    echo = EchoAgent(examples={"echo": ["echo a phrase", "repeat after me"]})
    await echo.start()
    local = InMemoryDispatcher()
    dispatcher = A2ADispatcher(
        local,
        caller="orchestrator",
        peers={"reviewer": A2APeerConfig("reviewer", echo.url)},
        policy=Policy.default(),
        audit=InMemoryAuditLog(),
    )
    extensions = ["examples.extensions.assistant"]
    orchestrator = build_agent(
        "orchestrator",
        dispatcher=dispatcher,
        extensions=extensions,
        entry_points=False,
        a2a_agents=["reviewer"],
    )
    weather = build_agent("weather", dispatcher=local, extensions=extensions, entry_points=False)
    serve_in_memory(local, [weather])
    goal = "check the weather in Paris and echo a phrase: hello there"
    try:
        answer = await orchestrator.handle(
            "AskGoal",
            AskGoalRequest(goal=goal),
            CallContext(
                caller="operator", target="orchestrator", capability="AskGoal", request_id="r1"
            ),
        )
        with pytest.raises(InvalidArgumentError, match=r"closest: a2a\.reviewer\.echo"):
            await orchestrator.handle(
                "AskGoal",
                AskGoalRequest(goal="repeat the invoice"),
                CallContext(
                    caller="operator", target="orchestrator", capability="AskGoal", request_id="r2"
                ),
            )
    finally:
        await dispatcher.aclose()
        for agent in (orchestrator, weather):
            await agent.aclose()
        await echo.stop()
    assert isinstance(answer, AskGoalResponse)
    assert answer.status == "succeeded"
    assert [(s.agent, s.capability, s.status) for s in answer.steps] == [
        ("weather", "GetWeather", "succeeded"),
        ("reviewer", "echo", "succeeded"),
    ]
    assert json.loads(answer.steps[1].request_json) == {
        "agent": "reviewer",
        "skill": "echo",
        "text": "echo a phrase: hello there",
    }
    assert "echo a phrase: hello there" in json.loads(answer.steps[1].output_json)["text"]


async def test_an_external_skill_has_side_effects_unless_the_deployment_says_read_only() -> None:
    """A card does not say whether a skill changes something: it is taken to, so a goal's
    approval holds it, unless the configured agent lists it in ``read_only_skills``."""
    echo = EchoAgent(examples={"echo": ["echo a phrase"]})
    await echo.start()
    unknown = A2AAgentClient(A2APeerConfig("reviewer", echo.url))
    declared = A2AAgentClient(A2APeerConfig("reviewer", echo.url, read_only_skills=("echo",)))
    try:
        assert {s.skill: s.side_effects for s in await unknown.skills()}["echo"] is True
        assert {s.skill: s.side_effects for s in await declared.skills()}["echo"] is False
    finally:
        await unknown.aclose()
        await declared.aclose()
        await echo.stop()
