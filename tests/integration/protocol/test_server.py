"""The server pipeline and the client over real gRPC on 127.0.0.1: each refusal, each outcome."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from stratagem.protocol import (
    CAPABILITIES,
    EXTENSION_FIELD,
    AgentClient,
    AgentServer,
    CallContext,
    CallerMetadataAuthenticator,
    CapabilitySpec,
    ClientConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    InMemoryAnswerStore,
    InMemoryAuditLog,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PlanEvent,
    PlanExecutionSequenceRequest,
    PlanSnapshot,
    Policy,
    ProtocolUsageError,
    Relation,
    RemoteError,
    RequestEnvelope,
    ResourceExhaustedError,
    SqliteAuditLog,
    UnavailableError,
    WireModel,
    current_call,
    digest,
    encode_request,
    register_capability,
    verify_chain,
)
from stratagem.protocol._audit import AuditRecord
from stratagem.protocol._audit import _sqlite as sqlite_audit
from tests.integration.protocol.conftest import Serve, Tracing
from tests.unit.protocol._support import BEAT, MIRA_IN_HALL, SAMPLES, FakeBackend

pytestmark = pytest.mark.integration

EXTRACT = SAMPLES["ExtractEntities"][0]
Connect = Callable[..., AgentClient]


def _envelope(capability: str = "ExtractEntities", **fields: object) -> RequestEnvelope:
    values: dict[str, object] = {
        "request_id": "req-1",
        "caller": "operator",
        "target": CAPABILITIES[capability].role,
        "capability": capability,
        "body": SAMPLES[capability][0],
        **fields,
    }
    return RequestEnvelope.model_validate(values)


def _metadata(
    caller: str | None = "operator", target: str = "perception", capability: str = "ExtractEntities"
) -> tuple[tuple[str, str], ...]:
    metadata = [("x-stratagem-target", target), ("x-stratagem-capability", capability)]
    if caller is not None:
        metadata.append(("x-stratagem-caller", caller))
    return tuple(metadata)


async def _raw(
    endpoint: str,
    data: bytes,
    metadata: Sequence[tuple[str, str]],
    *,
    deadline: float | None = 5.0,
    method: str = "Call",
) -> grpc.aio.AioRpcError:
    """Send raw bytes as a non-Stratagem client could; return the error the call must end with."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/stratagem.v1.AgentService/{method}")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(data, metadata=metadata, timeout=deadline)
    return caught.value


def _last(audit: InMemoryAuditLog) -> AuditRecord:
    return list(audit.records())[-1]


async def _eventually(audit: InMemoryAuditLog, action: str) -> AuditRecord:
    """The first record of ``action``, waiting (up to 5 s) for the server to write it."""
    async with asyncio.timeout(5):
        while True:
            for record in audit.records():
                if record.action == action:
                    return record
            await asyncio.sleep(0.01)


# --- the happy path ------------------------------------------------------------------------------


async def test_a_call_is_served_audited_and_answered(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    answer = await client.call(
        "perception", "ExtractEntities", EXTRACT, request_id="req-7", plan_id="goal-1", step_id="s1"
    )
    assert answer == SAMPLES["ExtractEntities"][1]
    [(capability, request, ctx)] = backend.calls
    assert (capability, request) == ("ExtractEntities", EXTRACT)
    assert (ctx.caller, ctx.target, ctx.request_id) == ("operator", "perception", "req-7")
    assert (ctx.plan_id, ctx.step_id) == ("goal-1", "s1")
    assert ctx.deadline is not None
    accepted, outcome = await _eventually(audit, "call.accepted"), _last(audit)
    assert (accepted.actor, accepted.capability, accepted.request_id) == (
        "operator",
        "ExtractEntities",
        "req-7",
    )
    assert accepted.digest == digest(
        encode_request(_envelope(request_id="req-7", plan_id="goal-1", step_id="s1"))
    )
    assert (outcome.action, outcome.code) == ("call.outcome", "OK")
    assert outcome.digest not in ("", accepted.digest)
    assert verify_chain(audit.records()).ok


def _uncursored(snapshots: list[PlanSnapshot]) -> list[PlanSnapshot]:
    """The snapshots without the cursors a page gives each."""
    return [snapshot.model_copy(update={"cursor": ""}) for snapshot in snapshots]


async def test_health_describe_and_plans(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    backend.snapshots = [
        PlanSnapshot(plan_id="goal-1", agent="perception", revision=1, status="running"),
        PlanSnapshot(plan_id="goal-2", agent="perception", revision=1, status="succeeded"),
    ]
    client = connect(server.endpoint)
    assert await client.health() == "SERVING"
    card = await client.describe()
    assert card.role == "perception"
    assert {c.name for c in card.capabilities} == {
        "ExtractEntities",
        "FindSpatialContext",
        "UpdateWorldState",
        "ListWorlds",
        "ShowWorld",
        "ResetWorld",
    }
    assert _uncursored(await client.plans("goal-2")) == backend.snapshots[1:]
    assert _uncursored(await client.plans()) == backend.snapshots
    assert (await connect(server.endpoint, caller="tactical").describe()).role == "perception"


async def test_plans_come_in_pages_that_fit_the_message_limit(
    serve: Serve, backend: FakeBackend, connect: Connect
) -> None:
    # 300 plans of ~8 KiB: 2.4 MiB in all, more than one 1 MiB message holds.
    big = json.dumps({"steps": ["x" * 8000]})
    backend.snapshots = [
        PlanSnapshot(plan_id=f"goal-{n:03d}", agent="perception", status="running", plan_json=big)
        for n in range(300)
    ]
    async with serve(backend) as server:
        client = connect(server.endpoint)
        assert _uncursored(await client.plans()) == backend.snapshots
        first, token = await client.plans_page()
        assert len(first) == 100  # the default page size
        assert token == "100"
        # The byte limit ends a page before its size does.
        big_page, token = await client.plans_page(page_size=1000, page_token="100")
        assert 100 < len(big_page) < 200
        assert big_page[0].plan_id == "goal-100"
        last, end = await client.plans_page(page_size=10, page_token="295")
        assert [p.plan_id for p in last] == [f"goal-{n}" for n in range(295, 300)]
        assert end == ""
        with pytest.raises(ProtocolUsageError, match="page_size"):
            await client.plans_page(page_size=5000)
        with pytest.raises(ProtocolUsageError, match="page_token"):
            await client.plans_page(page_token="abc")


async def test_health_says_not_serving_while_the_host_reports_a_problem(
    server: AgentServer, connect: Connect
) -> None:
    client = connect(server.endpoint)
    await server.set_serving(False)
    assert await client.health() == "NOT_SERVING"
    # Calls are still answered: the problem is reported, not enforced.
    assert (await client.describe()).role == "perception"
    await server.set_serving(True)
    assert await client.health() == "SERVING"


async def test_run_plan_is_served_audited_and_refusals_keep_their_code(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    snapshot = await client.run_plan('{"id": "user-plan", "steps": []}', request_id="run-1")
    assert (snapshot.plan_id, snapshot.agent, snapshot.status) == (
        "user-plan",
        "perception",
        "succeeded",
    )
    [(name, _, ctx)] = backend.calls
    assert (name, ctx.caller, ctx.capability) == ("RunPlan", "operator", "RunPlan")
    with pytest.raises(InvalidArgumentError, match="cycle: a -> b -> a"):
        await client.run_plan('{"id": "cycle"}', request_id="run-2")
    outcomes = {r.request_id: r.code for r in audit.records() if r.action == "call.outcome"}
    assert outcomes["run-1"] == "OK"
    assert outcomes["run-2"] == "INVALID_ARGUMENT"
    # Running plans is not for agents: the default policy grants it to the operator only.
    with pytest.raises(PermissionDeniedError, match="'RunPlan'"):
        await connect(server.endpoint, caller="orchestrator").run_plan('{"id": "x"}')
    assert len(backend.calls) == 2


async def test_watch_streams_events_until_the_plan_ends(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    backend.events = [
        PlanEvent(plan_id="goal-1", status="running", timestamp=1.0),
        PlanEvent(plan_id="goal-2", status="running", timestamp=1.5),
        PlanEvent(plan_id="goal-1/arc", step_id="arc", status="succeeded", timestamp=2.0),
        PlanEvent(plan_id="goal-1", status="succeeded", timestamp=3.0),
    ]
    client = connect(server.endpoint)
    events = [event async for event in client.watch("goal-1")]
    assert events == [backend.events[0], backend.events[2], backend.events[3]]
    outcome = _last(audit)
    assert (outcome.capability, outcome.code, outcome.detail) == (
        "Watch",
        "OK",
        "3 events streamed",
    )


async def test_watch_refusals(server: AgentServer, connect: Connect) -> None:
    with pytest.raises(NotFoundError, match="no plan 'missing'"):
        [event async for event in connect(server.endpoint).watch("missing")]
    with pytest.raises(PermissionDeniedError):
        [event async for event in connect(server.endpoint, caller="orchestrator").watch("goal-1")]


async def test_watch_ends_when_the_client_stops_reading(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    backend.events = [PlanEvent(plan_id="goal-1", status="running") for _ in range(100)]
    stream = connect(server.endpoint).watch("goal-1")
    assert (await anext(stream)).plan_id == "goal-1"
    await stream.aclose()
    record = await _eventually(audit, "call.outcome")
    assert record.code in ("CANCELLED", "OK")


# --- each refusal, its status code and its audit record -----------------------------------------


async def test_no_caller_is_unauthenticated(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog
) -> None:
    error = await _raw(server.endpoint, encode_request(_envelope()), _metadata(caller=None))
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "x-stratagem-caller" in error.details()
    record = await _eventually(audit, "call.refused")
    assert (record.actor, record.code) == ("", "UNAUTHENTICATED")
    assert backend.calls == []


async def test_a_malformed_caller_is_unauthenticated(server: AgentServer) -> None:
    error = await _raw(server.endpoint, encode_request(_envelope()), _metadata(caller="Op Erator"))
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_a_denied_caller_is_permission_denied_and_audited(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint, caller="strategic")
    with pytest.raises(PermissionDeniedError, match="'strategic' may not call 'ExtractEntities'"):
        await client.call("perception", "ExtractEntities", EXTRACT, request_id="denied-1")
    # Written before the answer was sent.
    [record] = [r for r in audit.records() if r.action == "call.denied"]
    assert (record.actor, record.target, record.capability, record.code) == (
        "strategic",
        "perception",
        "ExtractEntities",
        "PERMISSION_DENIED",
    )
    assert record.request_id == "denied-1"
    assert backend.calls == []


async def test_another_target_is_permission_denied(server: AgentServer) -> None:
    metadata = _metadata(target="strategic", capability="AnalyzeNarrative")
    error = await _raw(server.endpoint, encode_request(_envelope("AnalyzeNarrative")), metadata)
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_an_unserved_capability_is_not_found_only_for_an_allowed_caller(
    server: AgentServer,
) -> None:
    data = encode_request(_envelope("AnalyzeNarrative", target="perception"))
    metadata = _metadata(capability="AnalyzeNarrative")
    assert (await _raw(server.endpoint, data, metadata)).code() is grpc.StatusCode.NOT_FOUND
    denied = _metadata(caller="tactical", capability="AnalyzeNarrative")
    assert (await _raw(server.endpoint, data, denied)).code() is grpc.StatusCode.PERMISSION_DENIED


async def test_an_oversized_request_is_resource_exhausted(
    serve: Serve, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    async with serve(backend, max_message_bytes=1024) as server:
        client = connect(server.endpoint)
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED: the request is") as caught:
            await client.call("perception", "ExtractEntities", type(EXTRACT)(text="x" * 2000))
    assert caught.value.code.value == "RESOURCE_EXHAUSTED"
    record = await _eventually(audit, "call.refused")
    assert record.code == "RESOURCE_EXHAUSTED"
    assert backend.calls == []


async def test_an_invalid_field_is_invalid_argument_with_its_path(
    serve: Serve, audit: InMemoryAuditLog, connect: Connect
) -> None:
    tactical = FakeBackend("tactical")
    # Built without validation, as a buggy or foreign client could send it.
    bad_goal = Relation.model_construct(subject="mira", predicate="flies", object="tower")
    request = PlanExecutionSequenceRequest.model_construct(
        beat=BEAT.model_copy(update={"goals": [bad_goal]}),
        facts=[MIRA_IN_HALL],
        prior_beats=[],
        max_depth=4,
    )
    async with serve(tactical) as server:
        with pytest.raises(InvalidArgumentError) as caught:
            await connect(server.endpoint).call("tactical", "PlanExecutionSequence", request)
    [violation] = caught.value.violations
    assert violation.field == "beat.goals[0].predicate"
    assert "Input should be" in violation.description
    record = await _eventually(audit, "call.refused")
    assert record.code == "INVALID_ARGUMENT"
    assert "beat.goals[0].predicate" in record.detail
    assert tactical.calls == []


async def test_unparseable_bytes_are_invalid_argument(server: AgentServer) -> None:
    error = await _raw(server.endpoint, b"\xff\xff\xff\xff", _metadata())
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot parse" in error.details()


async def test_an_envelope_that_contradicts_the_metadata_is_invalid(server: AgentServer) -> None:
    data = encode_request(_envelope(caller="orchestrator"))
    error = await _raw(server.endpoint, data, _metadata(caller="operator"))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match the call metadata" in error.details()
    other_id = (*_metadata(), ("x-stratagem-request-id", "req-2"))
    error = await _raw(server.endpoint, encode_request(_envelope()), other_id)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT


# --- deadlines ----------------------------------------------------------------------------------


async def _sleep_forever(request: WireModel, ctx: CallContext) -> WireModel:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def test_a_slow_handler_is_deadline_exceeded_promptly(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    backend.behaviour["ExtractEntities"] = _sleep_forever
    async with asyncio.timeout(10):
        with pytest.raises(DeadlineExceededError):
            await connect(server.endpoint).call(
                "perception", "ExtractEntities", EXTRACT, timeout=0.3
            )
    record = await _eventually(audit, "call.outcome")
    assert record.code == "DEADLINE_EXCEEDED"


async def test_the_server_enforces_its_default_deadline(
    serve: Serve, backend: FakeBackend, audit: InMemoryAuditLog
) -> None:
    backend.behaviour["ExtractEntities"] = _sleep_forever
    async with serve(backend, default_deadline_s=0.2) as server, asyncio.timeout(10):
        error = await _raw(server.endpoint, encode_request(_envelope()), _metadata(), deadline=None)
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not finish within 0.2s" in error.details()


async def test_a_nested_call_inherits_the_remaining_deadline(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    client = connect(server.endpoint)
    outer = CallContext(
        "orchestrator", "orchestrator", "SubmitGoal", "outer", deadline=time.monotonic() + 2.0
    )
    token = current_call.set(outer)
    try:
        await client.call("perception", "ExtractEntities", EXTRACT, timeout=60)
    finally:
        current_call.reset(token)
    inner = backend.calls[0][2]
    assert inner.deadline is not None
    # gRPC rounds deadlines up a little; what matters is that 60 s became about 2 s.
    assert inner.deadline <= outer.deadline + 0.1


async def test_no_time_left_fails_before_sending(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    client = connect(server.endpoint)
    spent = CallContext(
        "orchestrator", "orchestrator", "SubmitGoal", "outer", deadline=time.monotonic() - 1
    )
    token = current_call.set(spent)
    try:
        with pytest.raises(DeadlineExceededError, match="no time is left"):
            await client.call("perception", "ExtractEntities", EXTRACT)
    finally:
        current_call.reset(token)
    assert backend.calls == []


# --- idempotency --------------------------------------------------------------------------------


async def test_a_duplicate_request_id_gets_the_stored_answer(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    first = await client.call("perception", "ExtractEntities", EXTRACT, request_id="once")
    second = await client.call("perception", "ExtractEntities", EXTRACT, request_id="once")
    assert first == second
    assert len(backend.calls) == 1
    assert _last(audit).action == "call.replayed"
    # The same id from another caller is another request.
    await connect(server.endpoint, caller="orchestrator").call(
        "perception", "ExtractEntities", EXTRACT, request_id="once"
    )
    assert len(backend.calls) == 2


async def test_a_reused_request_id_with_another_payload_is_failed_precondition(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    client = connect(server.endpoint)
    await client.call("perception", "ExtractEntities", EXTRACT, request_id="once")
    other = type(EXTRACT)(text="Something else entirely.")
    with pytest.raises(FailedPreconditionError, match="already used for a different request"):
        await client.call("perception", "ExtractEntities", other, request_id="once")
    assert len(backend.calls) == 1


async def test_a_request_repeated_on_nobodys_behalf_is_the_same_request(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    # A plan's step first asked while its agent served the operator's call (delegation
    # ["operator"]); the plan resumed after a restart asks again on nobody's behalf.
    client = connect(server.endpoint, caller="orchestrator")
    serving = CallContext("operator", "orchestrator", "RunPlan", "run-1")
    token = current_call.set(serving)
    try:
        first = await client.call(
            "perception", "ExtractEntities", EXTRACT, request_id="goal@1:read.17"
        )
    finally:
        current_call.reset(token)
    again = await client.call("perception", "ExtractEntities", EXTRACT, request_id="goal@1:read.17")
    assert again == first
    assert [ctx.delegation for _, _, ctx in backend.calls] == [("operator",)]
    # Another request under that id is still refused, whoever it is on behalf of.
    other = type(EXTRACT)(text="Something else entirely.")
    with pytest.raises(FailedPreconditionError, match="already used for a different request"):
        await client.call("perception", "ExtractEntities", other, request_id="goal@1:read.17")
    assert len(backend.calls) == 1


async def test_an_answer_stored_under_the_whole_message_digest_still_answers_its_repeat(
    backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    # Answers a server kept before requests were compared by ``same_request_digest`` carry the
    # digest of the whole request message (the one the audit log records).
    answers = InMemoryAnswerStore()
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=audit,
        answers=answers,
    )
    await server.start()
    try:
        client = connect(server.endpoint)
        first = await client.call("perception", "ExtractEntities", EXTRACT, request_id="old")
        (accepted,) = [r for r in audit.records() if r.action == "call.accepted"]
        kept = await answers.get("operator", "old")
        assert kept is not None
        assert kept.request_digest != accepted.digest
        await answers.put("operator", "old", accepted.digest, kept.answer)
        again = await client.call("perception", "ExtractEntities", EXTRACT, request_id="old")
        assert again == first
        assert len(backend.calls) == 1
    finally:
        await server.aclose()


class _SlowAudit(InMemoryAuditLog):
    """An audit log whose writes take a while, as a busy disk's would."""

    def append(self, **fields: str) -> AuditRecord:  # type: ignore[override]
        time.sleep(0.05)
        return super().append(**fields)


async def test_concurrent_duplicates_run_the_handler_once(connect: Connect) -> None:
    backend = FakeBackend()
    release = asyncio.Event()

    async def gated(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = gated
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=_SlowAudit(),
    )
    async with server:
        client = connect(server.endpoint)
        calls = [
            asyncio.create_task(
                client.call("perception", "ExtractEntities", EXTRACT, request_id="same")
            )
            for _ in range(3)
        ]
        await asyncio.sleep(0.3)  # every duplicate arrives while the first one is being accepted
        release.set()
        answers = await asyncio.gather(*calls)
    assert answers == [SAMPLES["ExtractEntities"][1]] * 3
    assert len(backend.calls) == 1


# --- handler failures ---------------------------------------------------------------------------


async def test_an_unexpected_exception_is_internal_without_a_traceback(
    server: AgentServer,
    backend: FakeBackend,
    audit: InMemoryAuditLog,
    connect: Connect,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(request: WireModel, ctx: CallContext) -> WireModel:
        raise RuntimeError("database password=hunter2 is wrong")

    backend.behaviour["ExtractEntities"] = broken
    with (
        caplog.at_level(logging.ERROR, logger="stratagem.protocol._server"),
        pytest.raises(InternalError) as caught,
    ):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)
    assert caught.value.message == "internal error"
    assert "Traceback" not in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in _last(audit).detail
    assert _last(audit).code == "INTERNAL"
    assert any(record.exc_info for record in caplog.records)


async def test_a_handler_error_keeps_its_status(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    async def refuse(request: WireModel, ctx: CallContext) -> WireModel:
        raise FailedPreconditionError("the vault is locked")

    backend.behaviour["ExtractEntities"] = refuse
    with pytest.raises(FailedPreconditionError, match="the vault is locked"):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)


async def test_a_handler_answering_the_wrong_model_is_internal(
    server: AgentServer, backend: FakeBackend, connect: Connect
) -> None:
    async def wrong(request: WireModel, ctx: CallContext) -> WireModel:
        return SAMPLES["AnalyzeNarrative"][1]

    backend.behaviour["ExtractEntities"] = wrong
    with pytest.raises(InternalError, match="internal error"):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)


# --- the client on its own ----------------------------------------------------------------------


async def test_an_unreachable_target_is_unavailable(connect: Connect) -> None:
    async with asyncio.timeout(10):
        with pytest.raises(UnavailableError):
            await connect("127.0.0.1:1").call("perception", "ExtractEntities", EXTRACT, timeout=5)


async def test_the_client_refuses_misuse_before_sending(connect: Connect) -> None:
    client = connect("127.0.0.1:1")
    with pytest.raises(ProtocolUsageError, match="does not serve"):
        await client.call("strategic", "ExtractEntities", EXTRACT)
    with pytest.raises(ProtocolUsageError, match="takes a ExtractEntitiesRequest"):
        await client.call("perception", "ExtractEntities", SAMPLES["AnalyzeNarrative"][0])
    with pytest.raises(ProtocolUsageError, match="invalid call"):
        await client.call("perception", "ExtractEntities", EXTRACT, plan_id="bad plan id")
    with pytest.raises(ProtocolUsageError, match="timeout must be positive"):
        await client.call("perception", "ExtractEntities", EXTRACT, timeout=0)
    await client.aclose()
    with pytest.raises(ProtocolUsageError, match="closed"):
        await client.call("perception", "ExtractEntities", EXTRACT)


async def test_a_too_large_response_is_refused_by_the_client(
    server: AgentServer, connect: Connect
) -> None:
    client = AgentClient(
        server.endpoint, caller="operator", config=ClientConfig(max_message_bytes=100)
    )
    async with client:
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as caught:
            await client.describe()
    assert caught.value.code.value == "RESOURCE_EXHAUSTED"


# --- lifecycle ----------------------------------------------------------------------------------


async def test_shutdown_lets_calls_in_flight_finish(
    serve: Serve, backend: FakeBackend, connect: Connect
) -> None:
    started = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        started.set()
        await asyncio.sleep(0.3)
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = slow
    async with serve(backend, grace_s=5.0) as server:
        client = connect(server.endpoint)
        call = asyncio.create_task(client.call("perception", "ExtractEntities", EXTRACT))
        await started.wait()
        await server.aclose()
        assert await call == SAMPLES["ExtractEntities"][1]
        with pytest.raises(UnavailableError):
            await client.health(timeout=2)


async def test_start_twice_and_endpoint_before_start_are_usage_errors(
    backend: FakeBackend, audit: InMemoryAuditLog
) -> None:
    server = AgentServer(
        backend, policy=Policy.default(), authenticator=CallerMetadataAuthenticator(), audit=audit
    )
    with pytest.raises(ProtocolUsageError, match="not started"):
        server.endpoint  # noqa: B018
    async with server:
        with pytest.raises(ProtocolUsageError, match="already started"):
            await server.start()


# --- tracing ------------------------------------------------------------------------------------


async def test_client_and_server_spans_share_a_trace(
    server: AgentServer, backend: FakeBackend, connect: Connect, tracing: Tracing
) -> None:
    async def refuse(request: WireModel, ctx: CallContext) -> WireModel:
        raise FailedPreconditionError("the vault is locked")

    await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT, plan_id="goal-1")
    spans = {span.kind: span for span in tracing.exporter.get_finished_spans()}
    client, served = spans[SpanKind.CLIENT], spans[SpanKind.SERVER]
    assert client.name == served.name == "stratagem.v1.AgentService/Call"
    assert served.context.trace_id == client.context.trace_id
    assert served.parent is not None
    assert served.parent.span_id == client.context.span_id
    for span in (client, served):
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "grpc"
        assert span.attributes["rpc.service"] == "stratagem.v1.AgentService"
        assert span.attributes["rpc.method"] == "Call"
        assert span.attributes["rpc.grpc.status_code"] == 0
        assert span.attributes["stratagem.capability"] == "ExtractEntities"
        assert span.attributes["stratagem.plan.id"] == "goal-1"

    tracing.exporter.clear()
    backend.behaviour["ExtractEntities"] = refuse
    with pytest.raises(FailedPreconditionError):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)
    spans = {span.kind: span for span in tracing.exporter.get_finished_spans()}
    # A client marks every failure as an error; a server only its own (RPC conventions).
    assert spans[SpanKind.CLIENT].status.status_code is StatusCode.ERROR
    assert spans[SpanKind.SERVER].status.status_code is StatusCode.UNSET
    assert spans[SpanKind.SERVER].attributes["rpc.grpc.status_code"] == 9

    tracing.exporter.clear()
    backend.behaviour["ExtractEntities"] = _sleep_forever
    with pytest.raises(DeadlineExceededError):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT, timeout=0.2)
    await asyncio.sleep(0.2)
    servers = [s for s in tracing.exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert servers[0].status.status_code is StatusCode.ERROR


# --- extension capabilities ---------------------------------------------------------------------


class ShoutRequest(WireModel):
    text: str


class ShoutResponse(WireModel):
    text: str


@pytest.fixture
def shout() -> AsyncIterator[CapabilitySpec]:
    spec = CapabilitySpec("Shout", "perception", EXTENSION_FIELD, ShoutRequest, ShoutResponse)
    register_capability(spec)
    yield spec
    del CAPABILITIES[spec.name]


async def test_an_extension_capability_is_served(
    server: AgentServer, backend: FakeBackend, connect: Connect, shout: CapabilitySpec
) -> None:
    async def handle(request: WireModel, ctx: CallContext) -> WireModel:
        assert isinstance(request, ShoutRequest)
        return ShoutResponse(text=request.text.upper())

    backend.behaviour["Shout"] = handle
    answer = await connect(server.endpoint).call("perception", "Shout", ShoutRequest(text="hi"))
    assert answer == ShoutResponse(text="HI")


# --- the audit log's async path -----------------------------------------------------------------


class _UnwritableAudit(InMemoryAuditLog):
    """An audit log that cannot record an acceptance, as a full disk could not."""

    def append(self, **fields: str) -> AuditRecord:  # type: ignore[override]
        if fields["action"] == "call.accepted":
            raise OSError("no space left on device")
        return super().append(**fields)


async def test_a_call_whose_acceptance_cannot_be_recorded_is_not_served(
    backend: FakeBackend, connect: Connect
) -> None:
    audit = _UnwritableAudit()
    async with AgentServer(
        backend, policy=Policy.default(), authenticator=CallerMetadataAuthenticator(), audit=audit
    ) as server:
        with pytest.raises(InternalError):
            await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)
    assert backend.calls == []
    assert [(r.action, r.code) for r in audit.records()] == [("call.refused", "INTERNAL")]


class _UncommittableAudit(SqliteAuditLog):
    """A SQLite audit log whose transactions all fail, as a full disk's would."""

    def _commit_on_loop(self, entries: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")


async def test_a_group_committed_acceptance_that_fails_answers_no_result_and_stops_serving(
    tmp_path: Path, backend: FakeBackend, connect: Connect
) -> None:
    # The acceptance commits with the outcome (one transaction per call): a call whose records
    # cannot be committed is answered INTERNAL, not with its result, and the log is then waited
    # for before any further handler runs.
    with _UncommittableAudit(tmp_path / "audit.db") as audit:
        async with AgentServer(
            backend,
            policy=Policy.default(),
            authenticator=CallerMetadataAuthenticator(),
            audit=audit,
        ) as server:
            client = connect(server.endpoint)
            with pytest.raises(InternalError):
                await client.call("perception", "ExtractEntities", EXTRACT)
            assert len(backend.calls) == 1
            with pytest.raises(InternalError):
                await client.call("perception", "ExtractEntities", EXTRACT)
            assert len(backend.calls) == 1
        assert list(audit.records()) == []


async def test_a_call_whose_handler_awaits_commits_its_two_records_in_one_transaction(
    tmp_path: Path, backend: FakeBackend, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The acceptance is held until the outcome is appended, however many turns the handler
    # takes (as a real agent's plan does): one transaction per call, acceptance first. The hold
    # is made long here, so that a loaded machine's slow turns cannot outlast it (at 10 ms,
    # three 1 ms sleeps sometimes did, and the acceptance was committed on its own).
    monkeypatch.setattr(sqlite_audit, "HOLD_S", 5.0)

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        for _ in range(3):
            await asyncio.sleep(0.001)
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = slow
    with SqliteAuditLog(tmp_path / "audit.db") as audit:
        async with AgentServer(
            backend,
            policy=Policy.default(),
            authenticator=CallerMetadataAuthenticator(),
            audit=audit,
        ) as server:
            client = connect(server.endpoint)
            for _ in range(3):
                await client.call("perception", "ExtractEntities", EXTRACT)
            assert audit._loop_commits == 3
        records = list(audit.records())
    assert [r.action for r in records] == ["call.accepted", "call.outcome"] * 3
    assert verify_chain(records).ok


class _BlockingOnlyAudit:
    """An ``AuditLog`` with only the blocking ``append``: the server calls it from a thread."""

    def __init__(self) -> None:
        self.log = InMemoryAuditLog()
        self.threads: set[str] = set()

    def append(self, **fields: str) -> AuditRecord:
        self.threads.add(threading.current_thread().name)
        return self.log.append(**fields)  # type: ignore[arg-type]

    def records(self) -> Iterator[AuditRecord]:
        return self.log.records()

    def head(self) -> str:
        return self.log.head()


async def test_a_blocking_audit_log_is_called_from_a_thread(
    backend: FakeBackend, connect: Connect
) -> None:
    audit = _BlockingOnlyAudit()
    async with AgentServer(
        backend, policy=Policy.default(), authenticator=CallerMetadataAuthenticator(), audit=audit
    ) as server:
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT)
    assert [r.action for r in audit.records()] == ["call.accepted", "call.outcome"]
    assert threading.current_thread().name not in audit.threads


@pytest.mark.integration
async def test_a_sqlite_audit_log_records_concurrent_calls_in_one_chain(
    tmp_path: Path, backend: FakeBackend, connect: Connect
) -> None:
    with SqliteAuditLog(tmp_path / "audit.db") as audit:
        async with AgentServer(
            backend,
            policy=Policy.default(),
            authenticator=CallerMetadataAuthenticator(),
            audit=audit,
        ) as server:
            client = connect(server.endpoint)
            await asyncio.gather(
                *(client.call("perception", "ExtractEntities", EXTRACT) for _ in range(40))
            )
        records = list(audit.records())
    assert verify_chain(records).ok
    assert sorted(r.action for r in records) == ["call.accepted"] * 40 + ["call.outcome"] * 40


class _EndlessWatch(FakeBackend):
    """A backend whose Watch streams stay open after one event, as a running plan's do."""

    async def watch(self, plan_id: str) -> AsyncIterator[PlanEvent]:
        yield PlanEvent(plan_id=plan_id, status="running")
        await asyncio.Event().wait()


async def test_a_burst_of_watch_opens_is_refused_by_the_agents_audited_admission(
    serve: Serve, audit: InMemoryAuditLog, connect: Connect
) -> None:
    # More Watch opens at once than gRPC core's pending-request limits used to allow for these
    # admission settings (2 x (4 + 4) = 16): each is answered by the agent's own limit, audited,
    # none CANCELLED by gRPC core before the agent sees it.
    config = {"max_watch_streams": 150, "max_concurrent_requests": 4, "max_queued_requests": 4}
    async with serve(_EndlessWatch(), **config) as server:  # type: ignore[attr-defined]
        clients = [connect(server.endpoint) for _ in range(4)]
        streams = [clients[n % 4].watch(f"goal-{n}") for n in range(200)]

        async def first(stream: AsyncIterator[PlanEvent]) -> str:
            try:
                await anext(stream)
            except RemoteError as exc:
                return exc.code
            return "OK"

        outcomes = Counter(await asyncio.gather(*(first(stream) for stream in streams)))
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
    assert outcomes == {"OK": 150, "RESOURCE_EXHAUSTED": 50}
    refused = [r for r in audit.records() if r.code == "RESOURCE_EXHAUSTED"]
    assert len(refused) == 50
    assert all("Watch streams are open" in r.detail for r in refused)


async def test_open_watch_streams_are_limited(
    serve: Serve, audit: InMemoryAuditLog, connect: Connect
) -> None:
    async with serve(_EndlessWatch(), max_watch_streams=2) as server:  # type: ignore[attr-defined]
        client = connect(server.endpoint)
        streams = [client.watch("goal-1"), client.watch("goal-2")]
        for stream in streams:
            assert (await anext(stream)).status == "running"
        with pytest.raises(ResourceExhaustedError, match="2 Watch streams are open"):
            await anext(client.watch("goal-3"))
        await streams[0].aclose()
        for _ in range(200):  # the server frees the slot once it sees the stream cancelled
            try:
                third = client.watch("goal-3")
                assert (await anext(third)).plan_id == "goal-3"
                break
            except ResourceExhaustedError:
                await asyncio.sleep(0.02)
        else:
            raise AssertionError("the closed stream's slot was never freed")
        await third.aclose()
        await streams[1].aclose()
