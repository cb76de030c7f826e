"""gRPC server reflection: a tool that knows nothing of Stratagem lists the agent's services and
reads AgentService's schema from the agent itself."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stratagem.protocol import AgentServer, CallerMetadataAuthenticator, InMemoryAuditLog, Policy
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
