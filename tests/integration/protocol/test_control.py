"""Control over real gRPC on 127.0.0.1, and answers kept across a restart of the server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ControlRequest,
    FailedPreconditionError,
    InMemoryAuditLog,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    Policy,
    ProtocolUsageError,
    SqliteAnswerStore,
    control_capability,
)
from stratagem.protocol._rpc import CALLER_KEY, CAPABILITY_KEY
from stratagem.protocol._service import CONTROL
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.integration

Connect = Callable[..., AgentClient]
EXTRACT = SAMPLES["ExtractEntities"][0]


async def test_approve_reaches_the_backend_with_the_caller_as_approver_and_is_audited(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    snapshot = await client.control(
        "plan-1", "approve", gate_id="g1", rationale="ok password=hunter2", output={"done": 1}
    )
    assert snapshot.status == "approve"
    [(request, ctx)] = backend.controls
    assert (request.plan_id, request.gate_id) == ("plan-1", "g1")
    assert request.output_json == '{"done": 1}'
    assert ctx.caller == "operator"
    assert ctx.capability == "Control.approve"
    accepted, outcome = list(audit.records())[-2:]
    assert (accepted.action, outcome.action) == ("call.accepted", "call.outcome")
    assert accepted.capability == "Control.approve"
    assert accepted.actor == "operator"
    assert "gate g1 by operator" in accepted.detail
    assert "recorded as done" in accepted.detail
    assert "hunter2" not in accepted.detail  # the rationale is redacted
    assert outcome.code == "OK"


@pytest.mark.parametrize("action", ["pause", "cancel", "resume"])
async def test_plan_actions_reach_the_backend(
    server: AgentServer, backend: FakeBackend, connect: Connect, action: str
) -> None:
    snapshot = await connect(server.endpoint).control("plan-1", action)  # type: ignore[arg-type]
    assert snapshot.status == action
    assert backend.controls[0][0].action == action


async def test_control_is_for_the_operator_only(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint, caller="orchestrator")
    with pytest.raises(PermissionDeniedError):
        await client.control("plan-1", "cancel")
    assert backend.controls == []
    assert list(audit.records())[-1].action == "call.denied"


async def test_control_refusals(server: AgentServer, connect: Connect) -> None:
    client = connect(server.endpoint)
    with pytest.raises(NotFoundError):
        await client.control("missing", "pause")
    with pytest.raises(ProtocolUsageError, match="gate_id"):
        await client.control("plan-1", "approve")


async def test_a_body_that_contradicts_the_capability_metadata_is_invalid(
    server: AgentServer, backend: FakeBackend
) -> None:
    body = CONTROL.encode_request(ControlRequest(plan_id="p", action="cancel"))
    async with grpc.aio.insecure_channel(server.endpoint) as channel:
        method = channel.unary_unary("/stratagem.v1.AgentService/Control")
        metadata = ((CALLER_KEY, "operator"), (CAPABILITY_KEY, control_capability("pause")))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(body, metadata=metadata, timeout=5)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert backend.controls == []


async def test_without_the_capability_metadata_the_body_names_the_action(
    server: AgentServer, backend: FakeBackend
) -> None:
    # A client generated from the .proto alone: the body routes the call, authorized as
    # Control.<action> all the same.
    body = CONTROL.encode_request(ControlRequest(plan_id="p", action="cancel"))
    async with grpc.aio.insecure_channel(server.endpoint) as channel:
        method = channel.unary_unary("/stratagem.v1.AgentService/Control")
        await method(body, metadata=((CALLER_KEY, "operator"),), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # the policy denies tactical
            await method(body, metadata=((CALLER_KEY, "tactical"),), timeout=5)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert [c.action for c, _ in backend.controls] == ["cancel"]


def test_control_request_round_trips_and_checks_its_fields() -> None:
    request = ControlRequest(plan_id="p", action="reject", gate_id="g", rationale="no", revision=2)
    assert CONTROL.decode_request(CONTROL.encode_request(request)) == request
    with pytest.raises(ValueError, match="output_json"):
        ControlRequest(plan_id="p", action="pause", output_json="{}")
    with pytest.raises(InvalidArgumentError):
        CONTROL.decode_request(b"\xff\xff")


async def test_a_durable_answer_is_replayed_after_the_server_restarts(
    tmp_path: Path, connect: Connect
) -> None:
    backend = FakeBackend()
    path = tmp_path / "answers.sqlite3"
    for _ in range(2):
        audit = InMemoryAuditLog()
        async with SqliteAnswerStore(path) as answers:
            server = AgentServer(
                backend,
                policy=Policy.default(),
                authenticator=CallerMetadataAuthenticator(),
                audit=audit,
                answers=answers,
            )
            async with server:
                client = connect(server.endpoint, caller="orchestrator")
                answer = await client.call(
                    "perception", "ExtractEntities", EXTRACT, request_id="p@1:s1"
                )
                assert answer == SAMPLES["ExtractEntities"][1]
                other = type(EXTRACT)(text="Another passage entirely.")
                with pytest.raises(FailedPreconditionError):
                    await client.call("perception", "ExtractEntities", other, request_id="p@1:s1")
    # The second server (a restart) answered from the file: the handler ran once.
    assert len(backend.calls) == 1
    assert [r.action for r in audit.records()] == ["call.replayed", "call.refused"]


async def test_replan_carries_its_plan_and_rationale_into_the_audit(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    snapshot = await connect(server.endpoint).control(
        "plan-1", "replan", plan_json='{"steps": []}', rationale="new passage"
    )
    assert snapshot.status == "replan"
    [(request, ctx)] = backend.controls
    assert request.plan_json == '{"steps": []}'
    assert ctx.capability == "Control.replan"
    accepted = list(audit.records())[-2]
    assert accepted.detail == "plan plan-1 replan by operator: new passage"


def test_replan_needs_a_plan_and_a_rationale() -> None:
    with pytest.raises(ValueError, match="replan needs plan_json and rationale"):
        ControlRequest(plan_id="p", action="replan", plan_json="{}")
    with pytest.raises(ValueError, match="plan_json is only for replan"):
        ControlRequest(plan_id="p", action="pause", plan_json="{}")


async def test_replay_answers_the_backends_report_and_is_audited(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    clean = await client.replay("plan-1")
    assert (clean.decisions, clean.diverged) == (9, False)
    diverged = await client.replay("diverged")
    assert [(d.step_id, d.decision) for d in diverged.divergences] == [("b", "output")]
    accepted, outcome = list(audit.records())[-2:]
    assert (accepted.capability, accepted.detail) == ("Replay", "plan diverged replay")
    assert outcome.detail == "plan diverged revision 1 replayed: 9 decisions, 1 diverged"
    with pytest.raises(NotFoundError):
        await client.replay("missing")


async def test_replay_is_for_the_operator_only(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    with pytest.raises(PermissionDeniedError):
        await connect(server.endpoint, caller="orchestrator").replay("plan-1")
    assert list(audit.records())[-1].action == "call.denied"


async def test_revisions_round_trip(server: AgentServer, connect: Connect) -> None:
    client = connect(server.endpoint)
    history = await client.revisions("plan-1")
    assert [(r.revision, r.parent) for r in history.revisions] == [(1, 0), (2, 1)]
    assert history.revisions[1].changed[0].fields == ["input"]
    with pytest.raises(NotFoundError):
        await client.revisions("missing")
