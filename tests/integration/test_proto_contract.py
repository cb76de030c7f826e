"""The wire contract is complete in the .proto: server reflection lists and describes the
services, and a client generated from proto/ alone, with the documented credentials, is served."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stratagem.protocol import (
    AgentServer,
    CallerMetadataAuthenticator,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    TokenAuthenticator,
    TokenSigner,
)
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from tests.unit.protocol._support import FakeBackend

pytestmark = pytest.mark.integration


async def test_reflection_lists_and_describes_the_agent_service() -> None:
    server = AgentServer(
        FakeBackend("perception"),
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.endpoint) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def ask(request: reflection_pb2.ServerReflectionRequest) -> object:
                async for answer in stub.ServerReflectionInfo(iter([request])):
                    return answer
                raise AssertionError("no answer")

            listed = await ask(reflection_pb2.ServerReflectionRequest(list_services=""))
            names = {s.name for s in listed.list_services_response.service}  # type: ignore[attr-defined]
            assert {"stratagem.v1.AgentService", "grpc.health.v1.Health"} <= names
            found = await ask(
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol="stratagem.v1.AgentService"
                )
            )
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in found.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
            ]
            services = {s.name: s for f in files for s in f.service}
            methods = {m.name for m in services["AgentService"].method}
            assert {"Call", "Describe", "Watch", "Plans", "RunPlan", "Control"} <= methods
    finally:
        await server.aclose()


async def test_a_call_with_only_the_documented_credentials_is_served(tmp_path: Path) -> None:
    # What a client generated from proto/ in any language sends: the authorization header and a
    # filled AgentRequest, no x-stratagem-* metadata.
    secret = ClusterSecret.load_or_create(tmp_path / "cluster.secret")
    backend = FakeBackend("perception")
    audit = InMemoryAuditLog()
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(TokenSigner(secret)),
        audit=audit,
    )
    await server.start()
    token = TokenSigner(secret).issue("operator", 300)
    request = pb.AgentRequest(
        request_id="0" * 32,
        caller="operator",
        target="perception",
        extract_entities=pb.ExtractEntitiesRequest(text="Mira waits in the courtyard."),
    )
    try:
        async with grpc.aio.insecure_channel(server.endpoint) as channel:
            call = channel.unary_unary(
                "/stratagem.v1.AgentService/Call",
                request_serializer=pb.AgentRequest.SerializeToString,
                response_deserializer=pb.AgentResponse.FromString,
            )
            answer = await call(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
            )
            assert answer.request_id == "0" * 32
            assert answer.WhichOneof("body") == "extract_entities"
            # The envelope routes it, so it must be the caller's own: another name is refused.
            other = pb.AgentRequest()
            other.CopyFrom(request)
            other.caller = "orchestrator"
            other.request_id = "1" * 32
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(other, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.aclose()
    assert [c for c, _, _ in backend.calls] == ["ExtractEntities"]
    assert [r.action for r in audit.records()][:2] == ["call.accepted", "call.outcome"]
