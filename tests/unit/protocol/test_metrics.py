"""RpcMetrics: call duration by method, capability and code; calls in flight."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from stratagem.protocol import Code, RpcMetrics


def metrics_by_name(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def test_durations_by_capability_and_code_and_requests_in_flight() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    rpc = RpcMetrics(provider)
    rpc.started("Call", "ExtractEntities")
    rpc.started("Call", "ExtractEntities")
    rpc.started("Describe")
    found = metrics_by_name(reader)
    (active,) = [
        p
        for p in found["stratagem.rpc.server.active_requests"]
        if p.attributes["stratagem.capability"] == "ExtractEntities"
    ]
    assert active.value == 2

    rpc.finished("Call", "ExtractEntities", Code.OK, 0.012)
    rpc.finished("Call", "ExtractEntities", Code.INVALID_ARGUMENT, 0.002)
    rpc.finished("Describe", "", Code.OK, 0.001)
    found = metrics_by_name(reader)
    assert {p.value for p in found["stratagem.rpc.server.active_requests"]} == {0}
    durations = {
        (p.attributes["rpc.method"], p.attributes["stratagem.capability"]): p
        for p in found["rpc.server.call.duration"]
        if p.attributes["rpc.grpc.status_code"] == 0
    }
    assert durations[("Call", "ExtractEntities")].count == 1
    assert abs(durations[("Call", "ExtractEntities")].sum - 0.012) < 1e-9
    (refused,) = [
        p for p in found["rpc.server.call.duration"] if p.attributes["rpc.grpc.status_code"] == 3
    ]
    assert refused.attributes == {
        "rpc.system": "grpc",
        "rpc.service": "stratagem.v1.AgentService",
        "rpc.method": "Call",
        "rpc.grpc.status_code": 3,
        "stratagem.capability": "ExtractEntities",
    }
    provider.shutdown()


def test_the_client_side_has_its_own_names() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    rpc = RpcMetrics(provider, side="client")
    rpc.started("Call", "PlanAction")
    rpc.finished("Call", "PlanAction", Code.UNAVAILABLE, 0.5)
    found = metrics_by_name(reader)
    assert set(found) == {"rpc.client.call.duration", "stratagem.rpc.client.active_requests"}
    provider.shutdown()


def test_without_a_provider_nothing_is_recorded_and_nothing_fails() -> None:
    rpc = RpcMetrics()  # the global provider: the API's no-op unless a process set one up
    rpc.started("Call", "PlanAction")
    rpc.finished("Call", "PlanAction", Code.OK, 0.001)
