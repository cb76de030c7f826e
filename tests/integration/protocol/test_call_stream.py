"""``CallStream``: many ``Call``s over one bidirectional stream keep every guarantee of a unary one.

Real gRPC over loopback sockets, token authentication with a real cluster secret; each call on the
stream is authenticated from its own frame, authorized, audited before its answer, bounded by its
own deadline and cancellable on its own, while the stream and its other calls go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import grpc
import pytest

from stratagem.protocol import (
    AUTHORIZATION_KEY,
    AgentClient,
    AgentServer,
    CallContext,
    CancelledError,
    ClientConfig,
    ClusterSecret,
    DeadlineExceededError,
    InMemoryAuditLog,
    InternalError,
    PermissionDeniedError,
    Policy,
    ResourceExhaustedError,
    ServerConfig,
    SqliteAuditLog,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
    UnauthenticatedError,
    UnavailableError,
    WireModel,
)
from stratagem.protocol._audit import AuditLog, AuditRecord
from stratagem.protocol._call_stream import CALL_STREAM_METHOD, CallStream
from stratagem.protocol._codec import encode_request
from stratagem.protocol._gen.stratagem.v1 import stream_pb2
from stratagem.protocol._models import RequestEnvelope
from stratagem.protocol._rpc import CALLER_KEY, CAPABILITY_KEY, TARGET_KEY
from stratagem.protocol._status import from_status_message
from tests.integration.protocol.conftest import Tracing
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.integration

EXTRACT, EXTRACTED = SAMPLES["ExtractEntities"]
FIND, FOUND = SAMPLES["FindSpatialContext"]

Serve = Callable[..., AbstractAsyncContextManager[AgentServer]]


@pytest.fixture
def signer(tmp_path: Path) -> TokenSigner:
    return TokenSigner(ClusterSecret.load_or_create(tmp_path / "cluster.secret"))


@pytest.fixture
def serve(tracing: Tracing, signer: TokenSigner) -> Serve:
    @asynccontextmanager
    async def serving(
        backend: FakeBackend, audit: AuditLog, **config: object
    ) -> AsyncIterator[AgentServer]:
        settings: dict[str, object] = {
            "default_deadline_s": 5.0,
            "grace_s": 1.0,
            "call_streams": True,
            **config,
        }
        server = AgentServer(
            backend,
            policy=Policy.default(),
            authenticator=TokenAuthenticator(signer),
            audit=audit,
            config=ServerConfig(**settings),  # type: ignore[arg-type]
            tracer_provider=tracing.provider,
        )
        await server.start()
        try:
            yield server
        finally:
            await server.aclose()

    return serving


def _client(
    endpoint: str, signer: TokenSigner, tracing: Tracing, identity: str = "operator"
) -> AgentClient:
    return AgentClient(
        endpoint,
        credentials=TokenCredentials(signer, identity),
        config=ClientConfig(default_timeout_s=5.0, call_stream=True),
        tracer_provider=tracing.provider,
    )


def _records(audit: InMemoryAuditLog, request_id: str) -> list[tuple[str, str]]:
    return [(r.action, r.code) for r in audit.records() if r.request_id == request_id]


async def _eventually(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_calls_on_one_stream_are_answered_out_of_order_by_request_id(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = slow
    audit = InMemoryAuditLog()
    async with serve(backend, audit) as server:
        client = _client(server.endpoint, signer, tracing)
        first = asyncio.create_task(
            client.call("perception", "ExtractEntities", EXTRACT, request_id="slow-1")
        )
        await _eventually(lambda: len(backend.calls) == 1)
        # The second call passes the first, still running on the same stream.
        answers = await asyncio.gather(
            *(
                client.call("perception", "FindSpatialContext", FIND, request_id=f"fast-{n}")
                for n in range(5)
            )
        )
        assert answers == [FOUND] * 5
        assert not first.done()
        release.set()
        assert await first == EXTRACTED
        await client.aclose()
    for request_id in ("slow-1", *(f"fast-{n}" for n in range(5))):
        assert _records(audit, request_id) == [("call.accepted", ""), ("call.outcome", "OK")]
    # One server span per call, each a child of its client span (its own trace context).
    spans = tracing.exporter.get_finished_spans()
    servers = [s for s in spans if s.kind.name == "SERVER"]
    clients = {s.context.span_id: s for s in spans if s.kind.name == "CLIENT"}
    assert len(servers) == 6
    for span in servers:
        assert span.parent is not None
        assert span.parent.span_id in clients
        assert clients[span.parent.span_id].context.trace_id == span.context.trace_id
    assert len({span.context.trace_id for span in servers}) == 6


async def test_both_audit_records_are_committed_before_the_answer(
    tmp_path: Path, serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    with SqliteAuditLog(tmp_path / "audit.db") as audit:
        async with serve(FakeBackend("perception"), audit) as server:
            client = _client(server.endpoint, signer, tracing)
            for n in range(3):
                await client.call("perception", "ExtractEntities", EXTRACT, request_id=f"a-{n}")
                # Read back from a second connection to the file: committed, not only queued.
                with SqliteAuditLog(tmp_path / "audit.db") as reader:
                    records = [r for r in reader.records() if r.request_id == f"a-{n}"]
                assert [(r.action, r.code) for r in records] == [
                    ("call.accepted", ""),
                    ("call.outcome", "OK"),
                ]
            await client.aclose()


class _UnwritableAudit(InMemoryAuditLog):
    """An audit log that cannot record an acceptance, as a full disk could not."""

    def append(self, **fields: str) -> AuditRecord:  # type: ignore[override]
        if fields["action"] == "call.accepted":
            raise OSError("no space left on device")
        return super().append(**fields)  # type: ignore[arg-type]


async def test_a_call_whose_acceptance_cannot_be_recorded_is_not_served(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    audit = _UnwritableAudit()
    async with serve(backend, audit) as server:
        client = _client(server.endpoint, signer, tracing)
        with pytest.raises(InternalError):
            await client.call("perception", "ExtractEntities", EXTRACT, request_id="disk-1")
        await client.aclose()
    assert backend.calls == []
    assert _records(audit, "disk-1") == [("call.refused", "INTERNAL")]


def _frame_metadata(token: str, capability: str) -> tuple[tuple[str, str], ...]:
    return (
        (AUTHORIZATION_KEY, f"Bearer {token}"),
        (CALLER_KEY, "operator"),
        (TARGET_KEY, "perception"),
        (CAPABILITY_KEY, capability),
    )


def _request(request_id: str) -> bytes:
    envelope = RequestEnvelope(
        request_id=request_id,
        caller="operator",
        target="perception",
        capability="ExtractEntities",
        body=EXTRACT,
    )
    return encode_request(envelope)


async def test_each_frame_is_authenticated_and_a_bad_token_refuses_only_its_call(
    tmp_path: Path, serve: Serve, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    audit = InMemoryAuditLog()
    good = signer.issue("operator", 60)
    expired = TokenSigner(
        ClusterSecret.load_or_create(tmp_path / "cluster.secret"),
        clock=lambda: time.time() - 7200,
    ).issue("operator", 60)
    async with serve(backend, audit) as server:
        channel = grpc.aio.insecure_channel(server.endpoint)
        stream = CallStream(channel)
        try:
            tokens = {"t-1": good, "t-2": "not-a-token", "t-3": expired, "t-4": good}
            outcomes = await asyncio.gather(
                *(
                    stream.call(
                        request_id,
                        _request(request_id),
                        5.0,
                        _frame_metadata(token, "ExtractEntities"),
                    )
                    for request_id, token in tokens.items()
                ),
                return_exceptions=True,
            )
        finally:
            await stream.aclose()
            await channel.close()
    assert isinstance(outcomes[0], bytes)
    assert isinstance(outcomes[3], bytes)
    assert isinstance(outcomes[1], UnauthenticatedError)
    assert isinstance(outcomes[2], UnauthenticatedError)
    assert "expired" in str(outcomes[2])
    assert len(backend.calls) == 2
    await _eventually(lambda: len(_records(audit, "t-3")) == 1)
    assert _records(audit, "t-2") == [("call.refused", "UNAUTHENTICATED")]
    assert _records(audit, "t-3") == [("call.refused", "UNAUTHENTICATED")]


async def test_a_slow_call_ends_at_its_deadline_while_the_others_on_the_stream_answer(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    ended = asyncio.Event()

    async def stuck(request: WireModel, ctx: CallContext) -> WireModel:
        try:
            await asyncio.sleep(60)
        finally:
            ended.set()
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = stuck
    audit = InMemoryAuditLog()
    async with serve(backend, audit) as server:
        client = _client(server.endpoint, signer, tracing)
        started = time.monotonic()
        slow = asyncio.create_task(
            client.call("perception", "ExtractEntities", EXTRACT, timeout=0.5, request_id="stuck-1")
        )
        fast = [
            await client.call("perception", "FindSpatialContext", FIND, request_id=f"f-{n}")
            for n in range(3)
        ]
        assert fast == [FOUND] * 3
        with pytest.raises(DeadlineExceededError):
            await slow
        assert time.monotonic() - started < 10  # not the handler's 60 s
        # The server ended the handler at its own deadline and audited it so.
        await asyncio.wait_for(ended.wait(), 10)
        await _eventually(lambda: len(_records(audit, "stuck-1")) == 2)
        assert _records(audit, "stuck-1") == [
            ("call.accepted", ""),
            ("call.outcome", "DEADLINE_EXCEEDED"),
        ]
        # The stream goes on.
        assert await client.call("perception", "FindSpatialContext", FIND) == FOUND
        await client.aclose()


async def test_a_cancelled_call_is_cancelled_on_the_server_and_the_stream_goes_on(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    cancelled = asyncio.Event()

    async def stuck(request: WireModel, ctx: CallContext) -> WireModel:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = stuck
    audit = InMemoryAuditLog()
    async with serve(backend, audit) as server:
        client = _client(server.endpoint, signer, tracing)
        task = asyncio.create_task(
            client.call("perception", "ExtractEntities", EXTRACT, request_id="gone-1")
        )
        await _eventually(lambda: len(backend.calls) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(cancelled.wait(), 10)
        await _eventually(lambda: len(_records(audit, "gone-1")) == 2)
        assert _records(audit, "gone-1") == [("call.accepted", ""), ("call.outcome", "CANCELLED")]
        assert await client.call("perception", "FindSpatialContext", FIND) == FOUND
        await client.aclose()


async def test_a_call_the_policy_denies_is_denied_and_audited_and_the_stream_goes_on(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    audit = InMemoryAuditLog()
    async with serve(backend, audit) as server:
        # The strategic agent may only ask perception to describe itself.
        client = _client(server.endpoint, signer, tracing, identity="strategic")
        with pytest.raises(PermissionDeniedError, match="may not call"):
            await client.call("perception", "ExtractEntities", EXTRACT, request_id="deny-1")
        with pytest.raises(PermissionDeniedError, match="may not call"):
            await client.call("perception", "FindSpatialContext", FIND, request_id="deny-2")
        assert (await client.describe()).role == "perception"
        await client.aclose()
    assert backend.calls == []
    assert _records(audit, "deny-1") == [("call.denied", "PERMISSION_DENIED")]
    assert _records(audit, "deny-2") == [("call.denied", "PERMISSION_DENIED")]


async def test_a_retry_under_the_same_request_id_on_the_stream_waits_for_the_first_attempt(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    # As over unary Calls: the handler runs once, and the retry gets the first attempt's answer
    # (not refused, nor answered with another attempt's frame).
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = slow
    audit = InMemoryAuditLog()
    async with serve(backend, audit) as server:
        client = _client(server.endpoint, signer, tracing)
        first = asyncio.create_task(
            client.call("perception", "ExtractEntities", EXTRACT, request_id="again-1")
        )
        await _eventually(lambda: len(backend.calls) == 1)
        retry = asyncio.create_task(
            client.call("perception", "ExtractEntities", EXTRACT, request_id="again-1")
        )
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(first, retry) == [EXTRACTED, EXTRACTED]
        await client.aclose()
    assert len(backend.calls) == 1
    assert sorted(_records(audit, "again-1")) == [
        ("call.accepted", ""),
        ("call.outcome", "OK"),
        ("call.replayed", "OK"),
    ]


def _frame(call_id: int, token: str, request_id: str) -> bytes:
    frame = stream_pb2.CallFrame(
        call_id=call_id,
        request_id=request_id,
        timeout_ms=5000,
        metadata=dict(_frame_metadata(token, "ExtractEntities")),
        request=_request(request_id),
    )
    return stream_pb2.CallFrames(frames=[frame]).SerializeToString()


async def _answer(stream: grpc.aio.StreamStreamCall) -> stream_pb2.CallAnswer:
    (answer,) = stream_pb2.CallAnswers.FromString(await stream.read()).answers
    return answer


async def test_a_call_id_still_running_is_refused_and_a_frame_that_does_not_parse_ends_the_stream(
    serve: Serve, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = slow
    token = signer.issue("operator", 60)
    sent: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def frames() -> AsyncIterator[bytes]:
        while (frame := await sent.get()) is not None:
            yield frame

    async with (
        serve(backend, InMemoryAuditLog()) as server,
        grpc.aio.insecure_channel(server.endpoint) as channel,
    ):
        stream = channel.stream_stream(CALL_STREAM_METHOD)(frames())
        sent.put_nowait(_frame(7, token, "id-1"))
        await _eventually(lambda: len(backend.calls) == 1)
        sent.put_nowait(_frame(7, token, "id-2"))
        refused = await _answer(stream)
        assert refused.call_id == 7
        assert refused.request_id == "id-2"
        assert from_status_message(refused.status).code.value == "INVALID_ARGUMENT"
        release.set()
        answered = await _answer(stream)
        assert (answered.call_id, answered.status) == (7, b"")
        sent.put_nowait(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await stream.read()
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not parse" in str(ended.value.details())


async def test_a_server_without_call_streams_refuses_them_and_unary_calls_still_work(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    async with serve(FakeBackend("perception"), InMemoryAuditLog(), call_streams=False) as server:
        client = _client(server.endpoint, signer, tracing)
        with pytest.raises(InternalError, match="UNIMPLEMENTED"):
            await client.call("perception", "FindSpatialContext", FIND)
        await client.aclose()
        unary = AgentClient(
            server.endpoint,
            credentials=TokenCredentials(signer, "operator"),
            tracer_provider=tracing.provider,
        )
        assert await unary.call("perception", "FindSpatialContext", FIND) == FOUND
        await unary.aclose()


async def test_closing_the_client_fails_its_waiting_calls_as_cancelled(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")

    async def stuck(request: WireModel, ctx: CallContext) -> WireModel:
        await asyncio.sleep(60)
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = stuck
    async with serve(backend, InMemoryAuditLog()) as server:
        client = _client(server.endpoint, signer, tracing)
        task = asyncio.create_task(client.call("perception", "ExtractEntities", EXTRACT))
        await _eventually(lambda: len(backend.calls) == 1)
        await client.aclose()
        with pytest.raises(CancelledError):
            await asyncio.wait_for(task, 10)


async def test_calls_on_a_stream_take_the_servers_slots_and_beyond_them_are_refused_and_audited(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = slow
    audit = InMemoryAuditLog()
    async with serve(backend, audit, max_concurrent_requests=1, max_queued_requests=1) as server:
        client = _client(server.endpoint, signer, tracing)
        held = [
            asyncio.create_task(
                client.call("perception", "ExtractEntities", EXTRACT, request_id=f"held-{n}")
            )
            for n in range(2)
        ]
        await _eventually(lambda: server.load == (1, 1))
        with pytest.raises(ResourceExhaustedError):
            await client.call("perception", "FindSpatialContext", FIND, request_id="over-1")
        release.set()
        assert await asyncio.gather(*held) == [EXTRACTED, EXTRACTED]
        await client.aclose()
    assert _records(audit, "over-1") == [("call.refused", "RESOURCE_EXHAUSTED")]


async def test_a_stream_the_server_ends_fails_its_calls_and_the_next_call_opens_another(
    serve: Serve, signer: TokenSigner, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")

    async def stuck(request: WireModel, ctx: CallContext) -> WireModel:
        await asyncio.sleep(60)
        return EXTRACTED

    backend.behaviour["ExtractEntities"] = stuck
    async with serve(backend, InMemoryAuditLog(), grace_s=0.1) as first:
        client = _client(first.endpoint, signer, tracing)
        assert await client.call("perception", "FindSpatialContext", FIND) == FOUND
        waiting = asyncio.create_task(client.call("perception", "ExtractEntities", EXTRACT))
        await _eventually(lambda: len(backend.calls) == 2)
        await first.aclose()  # ends the stream under the waiting call
        with pytest.raises((UnavailableError, CancelledError)):
            await asyncio.wait_for(waiting, 10)
        port = first.port
    # A server again on the same port: the client's next call opens a new stream to it.
    async with serve(FakeBackend("perception"), InMemoryAuditLog(), port=port) as second:
        for _ in range(50):
            try:
                answer = await client.call("perception", "FindSpatialContext", FIND)
                break
            except UnavailableError:
                await asyncio.sleep(0.1)  # the channel reconnects after its backoff
        assert answer == FOUND
        await client.aclose()
        assert second.port == port
