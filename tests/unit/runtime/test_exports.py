from __future__ import annotations

from stratagem import runtime

EXPECTED = [
    "AgentActor",
    "AgentInfo",
    "Deployment",
    "EndpointDirectory",
    "GoalOutcome",
    "GrpcDispatcher",
    "JsonLinesSpanExporter",
    "LaunchError",
    "LocalCluster",
    "Settings",
    "SpanRecord",
    "actor_name",
    "authenticator_for",
    "cluster_secret",
    "credentials_for",
    "load_policy",
    "load_settings",
    "read_spans",
    "run_goal",
    "setup_telemetry",
    "shutdown_telemetry",
]


def test_public_names_are_pinned() -> None:
    assert sorted(runtime.__all__) == sorted(EXPECTED)
    for name in EXPECTED:
        assert hasattr(runtime, name), name
