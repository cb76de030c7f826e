"""Server and client record request duration and in-flight metrics for every call."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    InMemoryAuditLog,
    PermissionDeniedError,
    Policy,
)
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.integration


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_calls_are_measured_on_both_sides_and_unvetted_capabilities_are_not_labels() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    server = AgentServer(
        FakeBackend("perception"),
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
        meter_provider=provider,
    )
    async with server:
        async with AgentClient(server.endpoint, caller="operator", meter_provider=provider) as ok:
            await ok.call("perception", "ExtractEntities", SAMPLES["ExtractEntities"][0])
        async with AgentClient(server.endpoint, caller="tactical", meter_provider=provider) as no:
            with pytest.raises(PermissionDeniedError):
                await no.call("perception", "ExtractEntities", SAMPLES["ExtractEntities"][0])
    served = {
        (p.attributes["stratagem.capability"], p.attributes["rpc.grpc.status_code"]): p.count
        for p in _points(reader, "rpc.server.call.duration")
    }
    # OK (0) labelled with its capability; the denied call (7) is not labelled with what it asked.
    assert served == {("ExtractEntities", 0): 1, ("", 7): 1}
    sent = {
        (p.attributes["stratagem.capability"], p.attributes["rpc.grpc.status_code"]): p.count
        for p in _points(reader, "rpc.client.call.duration")
    }
    assert sent == {("ExtractEntities", 0): 1, ("ExtractEntities", 7): 1}
    for side in ("server", "client"):
        active = _points(reader, f"stratagem.rpc.{side}.active_requests")
        assert active
        assert all(p.value == 0 for p in active)
    provider.shutdown()
