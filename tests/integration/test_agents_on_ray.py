"""The four agents as real Ray actors talking real gRPC, auditing to a real SQLite file."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest

from stratagem.agents import DEMO_GOAL
from stratagem.protocol import (
    ROLES,
    AgentClient,
    AnalyzeNarrativeRequest,
    ClientConfig,
    DeadlineExceededError,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    PermissionDeniedError,
    SqliteAuditLog,
    SubmitGoalRequest,
    verify_chain,
)
from stratagem.runtime import Deployment, Settings, read_spans, run_goal
from tests.integration._auth import credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_four_agents_are_up_on_distinct_processes(deployment: Deployment) -> None:
    infos = deployment.status()
    assert sorted(info.role for info in infos) == sorted(ROLES)
    assert len({info.pid for info in infos}) == 4
    assert len({info.endpoint for info in infos}) == 4
    for info in infos:
        host, _, port = info.endpoint.rpartition(":")
        assert host == "127.0.0.1"
        assert int(port) > 0


async def test_operator_request_reaches_perception_over_grpc(endpoints: dict[str, str]) -> None:
    async with AgentClient(endpoints["perception"], credentials=credentials()) as client:
        answer = await client.call(
            "perception",
            "ExtractEntities",
            ExtractEntitiesRequest(text="Mira waits in the courtyard. Mira has the iron key."),
        )
    assert isinstance(answer, ExtractEntitiesResponse)
    ids = {entity.id for entity in answer.entities}
    assert {"mira", "courtyard", "iron_key"} <= ids


async def test_goal_runs_actor_to_actor_and_is_one_trace(
    endpoints: dict[str, str], deployment: Deployment, settings: Settings
) -> None:
    outcome = await run_goal(endpoints, DEMO_GOAL, timeout_s=60, credentials=credentials())
    assert outcome.response.status == "succeeded"
    assert outcome.response.actions, "the goal produced no action sequence"
    assert len(outcome.response.beats) == DEMO_GOAL.beats
    # Every agent ran a plan for this goal, each reached from the orchestrator's plan.
    agents_with_plans = {snap.agent for snap in outcome.plans}
    assert agents_with_plans == set(ROLES)
    assert all(
        snap.plan_id == outcome.plan_id or snap.plan_id.startswith(outcome.plan_id + "/")
        for snap in outcome.plans
    )

    # The orchestrator's calls were audited by their targets with the orchestrator as caller.
    log = SqliteAuditLog(settings.audit_path)
    try:
        records = list(log.records())
    finally:
        log.close()
    assert verify_chain(records).ok
    callers = {(r.actor, r.target) for r in records if r.action == "call.accepted"}
    assert {
        ("orchestrator", "perception"),
        ("orchestrator", "strategic"),
        ("orchestrator", "tactical"),
    } <= callers

    # Spans from several processes share the goal's trace id.
    deployment.flush_telemetry()
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    provider.force_flush()  # type: ignore[attr-defined]
    assert settings.trace_file is not None
    spans = read_spans(settings.trace_file, outcome.trace_id)
    processes = {span.pid for span in spans}
    services = {span.service for span in spans}
    assert len(processes) >= 3, services
    assert {"stratagem-orchestrator", "stratagem-perception"} <= services
    # Every server span has a client span as its parent, in the same trace.
    by_id = {span.span_id: span for span in spans}
    servers = [span for span in spans if span.kind == "SERVER"]
    assert servers
    for server in servers:
        assert by_id[server.parent_id].kind == "CLIENT"


async def test_deadline_exceeded_returns_promptly(endpoints: dict[str, str]) -> None:
    request = SubmitGoalRequest(
        goal=DEMO_GOAL.goal,
        passage=DEMO_GOAL.passage,
        beats=DEMO_GOAL.beats,
        plan_id=f"deadline-{uuid.uuid4().hex[:8]}",
    )
    # Well below the goal's own duration (about 45 ms once the agents are warm), so the deadline
    # always cuts it short.
    config = ClientConfig(default_timeout_s=0.01)
    started = time.monotonic()
    async with AgentClient(
        endpoints["orchestrator"], credentials=credentials(), config=config
    ) as client:
        with pytest.raises(DeadlineExceededError):
            await client.call("orchestrator", "SubmitGoal", request)
    # Not a performance assertion: only that the caller is never left hanging.
    assert time.monotonic() - started < 10


async def test_permission_denied_is_audited(endpoints: dict[str, str], settings: Settings) -> None:
    request_id = f"denied-{uuid.uuid4().hex}"
    async with AgentClient(endpoints["strategic"], credentials=credentials("perception")) as client:
        with pytest.raises(PermissionDeniedError):
            await client.call(
                "strategic",
                "AnalyzeNarrative",
                AnalyzeNarrativeRequest(text="Mira waits in the courtyard."),
                request_id=request_id,
            )
    await asyncio.sleep(0)  # the audit write happens before the answer; nothing to wait for
    log = SqliteAuditLog(settings.audit_path)
    try:
        records = [r for r in log.records() if r.request_id == request_id]
    finally:
        log.close()
    assert len(records) == 1
    assert records[0].code == "PERMISSION_DENIED"
    assert records[0].actor == "perception"
    assert records[0].target == "strategic"


# Kept last in this module: it kills an agent of the session's deployment.
async def test_a_killed_agent_is_restarted_and_found_again(deployment: Deployment) -> None:
    before = {info.role: info for info in deployment.status()}
    victim = before["perception"]
    os.kill(victim.pid, signal.SIGKILL)
    # This test's own client asks for the new endpoints; the orchestrator still has the dead
    # one cached, and its retry must find the restarted agent through the directory.
    fresh = {info.role: info.endpoint for info in deployment.status(timeout_s=60)}
    outcome = await run_goal(fresh, DEMO_GOAL, timeout_s=60, credentials=credentials())
    assert outcome.response.status == "succeeded"
    after = {info.role: info for info in deployment.status()}
    assert after["perception"].restarted is True
    assert after["perception"].pid != victim.pid
    assert after["perception"].endpoint != victim.endpoint
    assert after["orchestrator"].pid == before["orchestrator"].pid
