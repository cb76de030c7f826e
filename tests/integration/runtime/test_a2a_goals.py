"""Goals that consult an external A2A agent: a plain ``a2a-sdk`` agent (``a2a_peer.EchoAgent``)
asked by the orchestrator in the middle of a goal, every agent a real gRPC server on 127.0.0.1
reaching the others over gRPC with its own token, the orchestrator's ``a2a`` steps sent by
``runtime.A2ADispatcher`` under the default policy. The goal is submitted through the operator
API. Nothing is mocked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.agents import Agent, build_agent
from stratagem.agents._a2a import A2ADispatcher
from stratagem.protocol import (
    ROLES,
    AgentServer,
    ClusterSecret,
    DeadlineExceededError,
    FailedPreconditionError,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
    SubmitGoalRequest,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
)
from stratagem.protocol._a2a._client import A2APeerConfig
from stratagem.runtime import InputError, Operator
from stratagem.runtime.host._directory import EndpointDirectory, GrpcDispatcher
from tests.integration.a2a_peer import EchoAgent
from tests.integration.runtime._served import REPO, RecordingDirectory, settings_for

pytestmark = pytest.mark.asyncio

CROWN = SubmitGoalRequest.model_validate(
    yaml.safe_load((REPO / "examples" / "crown.yaml").read_text(encoding="utf-8"))
)


class _Directory(EndpointDirectory):
    """The served agents' endpoints, without Ray (filled once the servers listen)."""

    def __init__(self) -> None:
        super().__init__("test")
        self.endpoints: dict[str, str] = {}

    async def resolve(self, role: str) -> str:
        return self.endpoints[role]

    def invalidate(self, role: str) -> None:
        pass


@dataclass
class Deployment:
    operator: Operator
    agents: dict[str, Agent]
    audit: InMemoryAuditLog
    spans: InMemorySpanExporter


@pytest.fixture
async def echo() -> AsyncIterator[EchoAgent]:
    agent = EchoAgent()
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


@pytest.fixture
async def deployed(tmp_path: Path, echo: EchoAgent) -> AsyncIterator[Deployment]:
    """The four agents over gRPC; the orchestrator knows four external agents, all the echo
    agent: ``reviewer`` (its ``echo`` skill), ``failing`` (``fail``), ``slow`` (``hang``, half
    a second a call) and ``stuck`` (``hang``, a minute a call)."""
    settings = settings_for(tmp_path / "state")
    settings.state_dir.mkdir(parents=True)
    secret = ClusterSecret.load_or_create(settings.secret_path)
    signer = TokenSigner(secret)
    peers = {
        "reviewer": A2APeerConfig("reviewer", echo.url, skill="echo"),
        "failing": A2APeerConfig("failing", echo.url, skill="fail"),
        "slow": A2APeerConfig("slow", echo.url, skill="hang", timeout_s=0.5),
        "stuck": A2APeerConfig("stuck", echo.url, skill="hang", timeout_s=60),
    }
    directory = _Directory()
    audit = InMemoryAuditLog()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agents: dict[str, Agent] = {}
    servers: list[AgentServer] = []
    dispatchers: list[GrpcDispatcher | A2ADispatcher] = []
    for role in ROLES:
        grpc = GrpcDispatcher(role, directory, credentials=TokenCredentials(signer, role))
        dispatcher: GrpcDispatcher | A2ADispatcher = grpc
        if role == "orchestrator":
            dispatcher = A2ADispatcher(
                grpc,
                caller=role,
                peers=peers,
                policy=Policy.default(),
                audit=audit,
                tracer_provider=provider,
            )
        dispatchers.append(dispatcher)  # the A2A one closes the gRPC one it wraps
        agents[role] = build_agent(
            role,
            dispatcher=dispatcher,
            entry_points=False,
            tracer_provider=provider if role == "orchestrator" else None,
            a2a_agents=sorted(peers),
        )
        servers.append(
            AgentServer(
                agents[role],
                policy=Policy.default(),
                authenticator=TokenAuthenticator(signer),
                audit=audit if role == "orchestrator" else InMemoryAuditLog(),
                config=ServerConfig(host="127.0.0.1", port=0, default_deadline_s=30.0),
            )
        )
        await servers[-1].start()
        directory.endpoints[role] = servers[-1].endpoint
    operator = Operator(settings=settings, directory=RecordingDirectory(directory.endpoints))
    try:
        yield Deployment(operator, agents, audit, exporter)
    finally:
        await operator.aclose()
        for server in servers:
            await server.aclose()
        for dispatcher in dispatchers:
            await dispatcher.aclose()
        for agent in agents.values():
            await agent.aclose()
        provider.shutdown()


async def test_a_goal_consults_an_a2a_sdk_agent_and_answers_with_what_it_said(
    deployed: Deployment, echo: EchoAgent
) -> None:
    request = CROWN.model_copy(update={"consult": ["reviewer"], "plan_id": "goal-reviewed"})
    outcome = await deployed.operator.submit(request, timeout=60)
    answer = outcome.response
    assert answer.status == "succeeded"
    (consulted,) = answer.consultations
    assert (consulted.agent, consulted.status, consulted.state) == (
        "reviewer",
        "answered",
        "completed",
    )
    # The echo agent gives back what it was sent: the goal and passage as text, the arc as data.
    assert consulted.text == f"Goal: {CROWN.goal}\n\nPassage:\n{CROWN.passage}"
    data = json.loads(consulted.data_json)
    assert (data["goal"], data["world"]) == (CROWN.goal, "goal-reviewed")
    assert [b["id"] for b in data["beats"]] == [b.id for b in answer.beats]
    # Its message id is the step's request id: a retried or resumed step sends the same one.
    assert echo.seen.message_ids == ["goal-reviewed@1:consult_reviewer"]
    records = [
        (r.action, r.target, r.code) for r in deployed.audit.records() if r.target == "a2a:reviewer"
    ]
    assert records == [("a2a.sent", "a2a:reviewer", ""), ("a2a.outcome", "a2a:reviewer", "OK")]
    # The client span sits in the consultation step's span, and its context reached the remote.
    spans = deployed.spans.get_finished_spans()
    client = next(s for s in spans if s.name == "a2a SendMessage reviewer")
    step = next(
        s
        for s in spans
        if s.attributes is not None
        and s.attributes.get("stratagem.step.id") == "consult_reviewer"
        and s.context.span_id == (client.parent.span_id if client.parent else None)
    )
    assert step.context.trace_id == client.context.trace_id
    assert echo.seen.traceparents[0].split("-")[1] == format(client.context.trace_id, "032x")


async def test_a_remote_that_fails_or_hangs_is_recorded_and_the_goal_goes_on(
    deployed: Deployment, echo: EchoAgent
) -> None:
    request = CROWN.model_copy(
        update={"consult": ["failing", "slow", "reviewer"], "plan_id": "goal-best-effort"}
    )
    outcome = await deployed.operator.submit(request, timeout=60)
    answer = outcome.response
    assert answer.status == "succeeded"
    assert answer.added  # the world changed all the same
    by_agent = {c.agent: c for c in answer.consultations}
    assert [c.agent for c in answer.consultations] == ["failing", "slow", "reviewer"]
    assert by_agent["failing"].status == "failed"
    assert "ended failed: the echo agent was asked to fail" in by_agent["failing"].error
    assert by_agent["slow"].status == "failed"
    assert "slow did not answer within 0.5 s" in by_agent["slow"].error
    assert by_agent["reviewer"].status == "answered"
    # The hanging agent was tried twice, with the same message id.
    assert echo.seen.message_ids.count("goal-best-effort@1:consult_slow") == 2


async def test_a_required_consultation_that_fails_fails_the_goal_before_the_world_changes(
    deployed: Deployment,
) -> None:
    request = CROWN.model_copy(
        update={"consult": ["failing"], "consult_required": True, "plan_id": "goal-required"}
    )
    with pytest.raises(FailedPreconditionError, match="consult_failing"):
        await deployed.operator.submit(request, timeout=60)
    perception = [s.plan_id for s in deployed.agents["perception"].plans("goal-required")]
    assert "goal-required/extract" in perception
    assert "goal-required/apply" not in perception


async def test_an_unknown_agent_is_refused_in_one_line_before_anything_runs(
    deployed: Deployment, echo: EchoAgent
) -> None:
    request = CROWN.model_copy(update={"consult": ["oracle"], "plan_id": "goal-unknown"})
    with pytest.raises(InputError) as refused:
        await deployed.operator.submit(request, timeout=60)
    assert str(refused.value) == (
        "goal refused: the goal consults 'oracle': not an external A2A agent of the "
        "orchestrator (configured in STRATAGEM_A2A_AGENTS: failing, reviewer, slow, stuck)"
    )
    assert echo.seen.message_ids == []
    assert deployed.agents["perception"].plans("goal-unknown") == []


async def test_a_goal_out_of_time_names_the_consultation_it_waited_on(
    deployed: Deployment,
) -> None:
    request = CROWN.model_copy(update={"consult": ["stuck"], "plan_id": "goal-stuck"})
    with pytest.raises(DeadlineExceededError) as caught:
        await deployed.operator.submit(request, timeout=8)
    assert (
        "step 'consult_stuck' of goal-stuck waited on the external A2A agent 'stuck' (its "
        "timeout_s in STRATAGEM_A2A_AGENTS bounds each attempt)"
    ) in caught.value.message
