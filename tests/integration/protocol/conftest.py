"""Fixtures for the protocol's integration tests: an in-memory audit log, a fake backend, a served
agent on 127.0.0.1 port 0 and clients of it; the TLS directories come from the unit conftest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ClientConfig,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
)
from tests.unit.protocol._support import FakeBackend
from tests.unit.protocol.conftest import foreign_dir, tls_dir

__all__ = ["Serve", "Tracing", "foreign_dir", "tls_dir"]


@dataclass
class Tracing:
    provider: TracerProvider
    exporter: InMemorySpanExporter


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Tracing(provider, exporter)
    provider.shutdown()


@pytest.fixture
def audit() -> InMemoryAuditLog:
    return InMemoryAuditLog()


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend("perception")


Serve = Callable[..., AbstractAsyncContextManager[AgentServer]]


@pytest.fixture
def serve(audit: InMemoryAuditLog, tracing: Tracing) -> Serve:
    """``async with serve(backend, **config) as server``: a started server, closed on exit."""

    @asynccontextmanager
    async def serving(backend: FakeBackend, **config: object) -> AsyncIterator[AgentServer]:
        settings: dict[str, object] = {"default_deadline_s": 5.0, "grace_s": 1.0, **config}
        server = AgentServer(
            backend,
            policy=Policy.default(),
            authenticator=CallerMetadataAuthenticator(),
            audit=audit,
            config=ServerConfig(**settings),
            tracer_provider=tracing.provider,
        )
        await server.start()
        try:
            yield server
        finally:
            await server.aclose()

    return serving


@pytest.fixture
async def server(serve: Serve, backend: FakeBackend) -> AsyncIterator[AgentServer]:
    async with serve(backend) as running:
        yield running


@pytest.fixture
async def connect(tracing: Tracing) -> AsyncIterator[Callable[..., AgentClient]]:
    """``connect(endpoint, caller)``: a client closed at the end of the test."""
    clients: list[AgentClient] = []

    def make(endpoint: str, caller: str = "operator", timeout_s: float = 10.0) -> AgentClient:
        client = AgentClient(
            endpoint,
            caller=caller,
            config=ClientConfig(default_timeout_s=timeout_s),
            tracer_provider=tracing.provider,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
