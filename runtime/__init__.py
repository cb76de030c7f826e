"""Stratagem's runtime: Ray actors hosting the agents and their gRPC servers, the launcher,
settings, telemetry set-up, the operator API (``Operator``, ``SyncOperator``: what the commands do,
from Python, without joining Ray where the agents' published endpoints suffice) and the
``stratagem`` command line. Ray is imported only here.

The names below are imported on first use (PEP 562), so that importing the package, as the
``stratagem`` command does before it knows which command runs, loads neither Ray nor gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stratagem.runtime.config._lazy import load

if TYPE_CHECKING:
    from stratagem.runtime.config._errors import (
        InputError,
        LaunchError,
        PlanNotFoundError,
        StratagemRuntimeError,
    )
    from stratagem.runtime.config._extensions import deployment_roles
    from stratagem.runtime.config._security import (
        authenticator_for,
        cluster_secret,
        credentials_for,
    )
    from stratagem.runtime.config._settings import Settings, load_settings
    from stratagem.runtime.host._actor import AgentActor, load_policy
    from stratagem.runtime.host._directory import (
        AgentInfo,
        EndpointDirectory,
        GrpcDispatcher,
        actor_name,
    )
    from stratagem.runtime.host._launcher import Deployment
    from stratagem.runtime.host._local import LocalCluster
    from stratagem.runtime.host._ray_directory import RayDirectory
    from stratagem.runtime.operator._artifacts import ArtifactReadError, ArtifactsClient
    from stratagem.runtime.operator._goal import GoalOutcome, GoalStarted, run_goal
    from stratagem.runtime.operator._history import (
        HistoryFilter,
        HistoryPage,
        PlanHistory,
        PlanView,
        StepView,
        TraceSummary,
    )
    from stratagem.runtime.operator._memory import (
        MemoryAccessError,
        MemoryClient,
        SyncMemoryClient,
    )
    from stratagem.runtime.operator._operator import Directory, Operator
    from stratagem.runtime.operator._operator_sync import SyncOperator
    from stratagem.runtime.telemetry._telemetry import (
        JsonLinesSpanExporter,
        SpanRecord,
        read_spans,
        setup_telemetry,
        shutdown_telemetry,
    )

_HOME: dict[str, str] = {
    "AgentActor": "host._actor",
    "load_policy": "host._actor",
    "AgentInfo": "host._directory",
    "EndpointDirectory": "host._directory",
    "GrpcDispatcher": "host._directory",
    "actor_name": "host._directory",
    "deployment_roles": "config._extensions",
    "ArtifactReadError": "operator._artifacts",
    "ArtifactsClient": "operator._artifacts",
    "GoalOutcome": "operator._goal",
    "GoalStarted": "operator._goal",
    "run_goal": "operator._goal",
    "HistoryFilter": "operator._history",
    "HistoryPage": "operator._history",
    "PlanHistory": "operator._history",
    "PlanView": "operator._history",
    "StepView": "operator._history",
    "TraceSummary": "operator._history",
    "InputError": "config._errors",
    "PlanNotFoundError": "config._errors",
    "StratagemRuntimeError": "config._errors",
    "Deployment": "host._launcher",
    "LaunchError": "config._errors",
    "LocalCluster": "host._local",
    "Directory": "operator._operator",
    "Operator": "operator._operator",
    "RayDirectory": "host._ray_directory",
    "SyncOperator": "operator._operator_sync",
    "MemoryAccessError": "operator._memory",
    "MemoryClient": "operator._memory",
    "SyncMemoryClient": "operator._memory",
    "authenticator_for": "config._security",
    "cluster_secret": "config._security",
    "credentials_for": "config._security",
    "Settings": "config._settings",
    "load_settings": "config._settings",
    "JsonLinesSpanExporter": "telemetry._telemetry",
    "SpanRecord": "telemetry._telemetry",
    "read_spans": "telemetry._telemetry",
    "setup_telemetry": "telemetry._telemetry",
    "shutdown_telemetry": "telemetry._telemetry",
}


# config._lazy, not protocol's lazy_exports: importing anything of stratagem.protocol would load
# gRPC and pydantic here, which is what this package's laziness keeps out of `stratagem --help`.
def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = load(f"{__name__}.{module}:{name}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
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
