from __future__ import annotations

from stratagem import runtime

EXPECTED = [
    "AgentActor",
    "AgentInfo",
    "ArtifactReadError",
    "ArtifactsClient",
    "Deployment",
    "Directory",
    "EndpointDirectory",
    "GoalOutcome",
    "GoalStarted",
    "GrpcDispatcher",
    "HistoryFilter",
    "HistoryPage",
    "InputError",
    "JsonLinesSpanExporter",
    "LaunchError",
    "LocalCluster",
    "MemoryAccessError",
    "MemoryClient",
    "Operator",
    "PlanHistory",
    "PlanNotFoundError",
    "PlanView",
    "RayDirectory",
    "Settings",
    "SpanRecord",
    "StepView",
    "StratagemRuntimeError",
    "SyncMemoryClient",
    "SyncOperator",
    "TraceSummary",
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
