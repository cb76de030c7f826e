"""Stratagem plans calling external A2A agents: a plain ``a2a-sdk`` agent and a Stratagem agent's
A2A face, reached by cross-agent steps whose target is ``a2a`` (``runtime.A2ADispatcher``).

Real servers on 127.0.0.1, the real engine, the default policy, audit logs in memory and an SDK
tracer provider; nothing is mocked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.agents import ToolRegistry, build_agent
from stratagem.planning import (
    CrossAgentStep,
    Engine,
    InMemoryDispatcher,
    Plan,
    PlanStatus,
    RetryPolicy,
    validate_plan,
)
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
from stratagem.runtime.host._a2a import A2ADispatcher
from tests.integration.a2a_peer import EchoAgent

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def echo() -> AsyncIterator[EchoAgent]:
    agent = EchoAgent()
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


def _plan(request: dict[str, Any], plan_id: str = "talk", **step: Any) -> Plan:
    return Plan(
        id=plan_id,
        owner="orchestrator",
        goal="ask an agent of another framework",
        steps=[
            CrossAgentStep(
                id="ask",
                target="a2a",
                capability="SendA2AMessage",
                request=request,
                **step,
            )
        ],
    )


def _engine(
    peers: dict[str, A2APeerConfig],
    audit: InMemoryAuditLog,
    *,
    caller: str = "orchestrator",
    tracer_provider: TracerProvider | None = None,
) -> tuple[Engine, A2ADispatcher]:
    dispatcher = A2ADispatcher(
        InMemoryDispatcher(),
        caller=caller,
        peers=peers,
        policy=Policy.default(),
        audit=audit,
        tracer_provider=tracer_provider,
    )
    engine = Engine(
        tools=ToolRegistry(caller),
        dispatcher=dispatcher,
        agent=caller,
        tracer_provider=tracer_provider,
    )
    return engine, dispatcher


async def test_a_plan_step_asks_an_a2a_sdk_agent(echo: EchoAgent) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    audit = InMemoryAuditLog()
    engine, dispatcher = _engine(
        {"echo": A2APeerConfig("echo", echo.url, skill="echo")}, audit, tracer_provider=provider
    )
    plan = _plan({"agent": "echo", "text": "hello", "data": {"n": 3}})
    # A plan naming the external agent passes the same validation as any other.
    validate_plan(plan, tools=ToolRegistry("orchestrator"))
    try:
        result = await engine.run(plan)
    finally:
        await dispatcher.aclose()
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    output = result.outputs["ask"]
    assert (output["state"], output["text"], output["data"]) == ("completed", "hello", {"n": 3})
    request_id = "talk@1:ask"  # plan @ revision : step
    assert echo.seen.message_ids == [request_id]
    actions = [(r.action, r.target, r.code) for r in audit.records()]
    assert actions == [("a2a.sent", "a2a:echo", ""), ("a2a.outcome", "a2a:echo", "OK")]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    client = spans["a2a SendMessage echo"]
    # The remote got the client span's trace context.
    assert echo.seen.traceparents[0].split("-")[1] == format(client.context.trace_id, "032x")
    provider.shutdown()


async def test_a_failed_remote_task_fails_the_step_as_logic(echo: EchoAgent) -> None:
    audit = InMemoryAuditLog()
    engine, dispatcher = _engine({"echo": A2APeerConfig("echo", echo.url)}, audit)
    try:
        result = await engine.run(_plan({"agent": "echo", "skill": "fail", "text": "x"}))
    finally:
        await dispatcher.aclose()
    assert result.status is PlanStatus.FAILED
    (failure,) = result.failures
    assert failure.failure_class == "logic"
    assert "ended failed: the echo agent was asked to fail" in failure.message
    assert [r.code for r in audit.records()] == ["", "FAILED_PRECONDITION"]


async def test_an_unreachable_agent_is_transient_and_retried() -> None:
    audit = InMemoryAuditLog()
    engine, dispatcher = _engine({"gone": A2APeerConfig("gone", "http://127.0.0.1:9/")}, audit)
    retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.01)
    try:
        result = await engine.run(_plan({"agent": "gone", "text": "x"}, retry=retry))
    finally:
        await dispatcher.aclose()
    (failure,) = result.failures
    assert (failure.failure_class, failure.attempts) == ("transient", 2)
    assert "gone is unreachable" in failure.message


async def test_nothing_is_sent_outside_the_policy(echo: EchoAgent) -> None:
    audit = InMemoryAuditLog()
    # The default policy lets the orchestrator call external agents; not the tactical agent.
    engine, dispatcher = _engine(
        {"echo": A2APeerConfig("echo", echo.url)}, audit, caller="tactical"
    )
    plan = _plan({"agent": "echo", "text": "x"}).model_copy(update={"owner": "tactical"})
    try:
        result = await engine.run(plan)
    finally:
        await dispatcher.aclose()
    (failure,) = result.failures
    assert failure.failure_class == "policy"
    assert echo.seen.message_ids == []
    assert [(r.action, r.code) for r in audit.records()] == [("a2a.denied", "PERMISSION_DENIED")]


async def test_an_unknown_external_agent_fails_the_step_as_logic(echo: EchoAgent) -> None:
    engine, dispatcher = _engine({"echo": A2APeerConfig("echo", echo.url)}, InMemoryAuditLog())
    try:
        result = await engine.run(_plan({"agent": "elsewhere", "text": "x"}))
    finally:
        await dispatcher.aclose()
    (failure,) = result.failures
    assert failure.failure_class == "logic"
    assert "no external A2A agent 'elsewhere'" in failure.message


async def test_a_stratagem_agent_over_a2a_answers_a_retried_step_once() -> None:
    signer = TokenSigner(ClusterSecret.generate())
    remote_audit = InMemoryAuditLog()
    agent = build_agent("perception")
    server = AgentServer(
        agent,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(signer),
        audit=remote_audit,
        config=ServerConfig(grace_s=1.0),
    )
    await server.start()
    a2a = A2AServer(server, agent, A2AConfig())
    await a2a.start()
    peer = A2APeerConfig("story", a2a.url, token=signer.issue("operator", 600))
    engine, dispatcher = _engine({"story": peer}, InMemoryAuditLog())
    text = "Mira is a knight. Mira is in the courtyard."
    try:
        first = await engine.run(_plan({"agent": "story", "text": text}, plan_id="retold"))
        # The same plan again (a resumed or repeated run): the same message id, answered once.
        again = await Engine(
            tools=ToolRegistry("orchestrator"), dispatcher=dispatcher, agent="orchestrator"
        ).run(_plan({"agent": "story", "text": text}, plan_id="retold"))
    finally:
        await dispatcher.aclose()
        await a2a.aclose()
        await server.aclose()
        await agent.aclose()
    assert first.outputs["ask"] == again.outputs["ask"]
    assert {e["id"] for e in first.outputs["ask"]["data"]["entities"]} == {"mira", "courtyard"}
    actions = [r.action for r in remote_audit.records() if r.capability == "ExtractEntities"]
    assert actions == ["call.accepted", "call.outcome", "call.replayed"]


async def test_an_answer_past_the_limit_is_not_read_and_fails_the_step(echo: EchoAgent) -> None:
    peer = A2APeerConfig("echo", echo.url, max_answer_bytes=32 * 1024)
    engine, dispatcher = _engine({"echo": peer}, InMemoryAuditLog())
    try:
        result = await engine.run(_plan({"agent": "echo", "text": "x" * 60_000}))
    finally:
        await dispatcher.aclose()
    (failure,) = result.failures
    assert failure.failure_class == "logic"
    assert "answered more than 32768 bytes" in failure.message
