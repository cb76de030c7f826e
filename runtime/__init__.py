"""Stratagem's runtime: Ray actors hosting the agents and their gRPC servers, the launcher,
settings, telemetry set-up, the operator API (``Operator``, ``SyncOperator``: what the commands do,
from Python, without joining Ray where the agents' published endpoints suffice) and the
``stratagem`` command line. Ray is imported only here.

The names below are imported on first use (PEP 562), so that importing the package, as the
``stratagem`` command does before it knows which command runs, loads neither Ray nor gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratagem.runtime._actor import AgentActor, load_policy
    from stratagem.runtime._directory import (
        AgentInfo,
        EndpointDirectory,
        GrpcDispatcher,
        actor_name,
    )
    from stratagem.runtime._extensions import deployment_roles
    from stratagem.runtime._goal import GoalOutcome, run_goal
    from stratagem.runtime._history import (
        HistoryFilter,
        HistoryPage,
        PlanHistory,
        PlanView,
        StepView,
        TraceSummary,
    )
    from stratagem.runtime._input import InputError, PlanNotFoundError
    from stratagem.runtime._launcher import Deployment
    from stratagem.runtime._local import LaunchError, LocalCluster
    from stratagem.runtime._operator import Directory, Operator, RayDirectory
    from stratagem.runtime._operator_sync import SyncOperator
    from stratagem.runtime._security import authenticator_for, cluster_secret, credentials_for
    from stratagem.runtime._settings import Settings, load_settings
    from stratagem.runtime._telemetry import (
        JsonLinesSpanExporter,
        SpanRecord,
        read_spans,
        setup_telemetry,
        shutdown_telemetry,
    )

_HOME: dict[str, str] = {
    "AgentActor": "_actor",
    "load_policy": "_actor",
    "AgentInfo": "_directory",
    "EndpointDirectory": "_directory",
    "GrpcDispatcher": "_directory",
    "actor_name": "_directory",
    "deployment_roles": "_extensions",
    "GoalOutcome": "_goal",
    "run_goal": "_goal",
    "HistoryFilter": "_history",
    "HistoryPage": "_history",
    "PlanHistory": "_history",
    "PlanView": "_history",
    "StepView": "_history",
    "TraceSummary": "_history",
    "InputError": "_input",
    "PlanNotFoundError": "_input",
    "Deployment": "_launcher",
    "LaunchError": "_local",
    "LocalCluster": "_local",
    "Directory": "_operator",
    "Operator": "_operator",
    "RayDirectory": "_operator",
    "SyncOperator": "_operator_sync",
    "authenticator_for": "_security",
    "cluster_secret": "_security",
    "credentials_for": "_security",
    "Settings": "_settings",
    "load_settings": "_settings",
    "JsonLinesSpanExporter": "_telemetry",
    "SpanRecord": "_telemetry",
    "read_spans": "_telemetry",
    "setup_telemetry": "_telemetry",
    "shutdown_telemetry": "_telemetry",
}


# Not protocol's lazy_exports: importing anything of stratagem.protocol would load gRPC and pydantic
# here, which is what this package's laziness keeps out of `stratagem --help`.
def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AgentActor",
    "AgentInfo",
    "Deployment",
    "Directory",
    "EndpointDirectory",
    "GoalOutcome",
    "GrpcDispatcher",
    "HistoryFilter",
    "HistoryPage",
    "InputError",
    "JsonLinesSpanExporter",
    "LaunchError",
    "LocalCluster",
    "Operator",
    "PlanHistory",
    "PlanNotFoundError",
    "PlanView",
    "RayDirectory",
    "Settings",
    "SpanRecord",
    "StepView",
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
