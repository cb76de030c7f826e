from __future__ import annotations

from stratagem import runtime

EXPECTED = [
    "AgentActor",
    "AgentInfo",
    "Deployment",
    "Directory",
    "EndpointDirectory",
    "GoalOutcome",
    "GrpcDispatcher",
    "InputError",
    "JsonLinesSpanExporter",
    "LaunchError",
    "LocalCluster",
    "Operator",
    "PlanNotFoundError",
    "RayDirectory",
    "Settings",
    "SpanRecord",
    "SyncOperator",
    "actor_name",
    "authenticator_for",
    "cluster_secret",
    "credentials_for",
    "deployment_roles",
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
