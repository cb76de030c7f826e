"""Stratagem's runtime: Ray actors hosting the agents and their gRPC servers, the launcher,
settings, telemetry set-up and the ``stratagem`` command line. Ray is imported only here."""

from stratagem.runtime._actor import AgentActor, load_policy
from stratagem.runtime._directory import AgentInfo, EndpointDirectory, GrpcDispatcher, actor_name
from stratagem.runtime._goal import GoalOutcome, run_goal
from stratagem.runtime._launcher import Deployment, LaunchError, LocalCluster
from stratagem.runtime._security import authenticator_for, cluster_secret, credentials_for
from stratagem.runtime._settings import Settings, load_settings
from stratagem.runtime._telemetry import (
    JsonLinesSpanExporter,
    SpanRecord,
    read_spans,
    setup_telemetry,
    shutdown_telemetry,
)

__all__ = [
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
