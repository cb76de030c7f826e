"""Plan models, DAG algorithms, validation, failure classes and the engine that runs plans.

The public names are re-exported here; the ``_module.py`` files are private. ``docs/internals.md``
describes how the names fit the layers around this one.
"""

from planning._dag import find_cycle, topological_layers
from planning._dispatch import CrossAgentCall, Dispatcher, Handler, InMemoryDispatcher
from planning._engine import (
    Engine,
    EngineConfig,
    PlanResult,
    StepEvent,
    ToolContext,
    ToolRunner,
)
from planning._errors import (
    LogicError,
    PlanFailedError,
    PlanningError,
    PlanValidationError,
    PolicyError,
    RefError,
    StepError,
    StepFailure,
    TransientError,
    failure_class_for_code,
)
from planning._plan import (
    CrossAgentStep,
    FailureClass,
    Plan,
    PlanStatus,
    RetryPolicy,
    Step,
    StepBase,
    StepStatus,
    ToolStep,
)
from planning._refs import Ref, ref, refs_in, resolve_refs
from planning._validate import validate_plan

__all__ = [
    "CrossAgentCall",
    "CrossAgentStep",
    "Dispatcher",
    "Engine",
    "EngineConfig",
    "FailureClass",
    "Handler",
    "InMemoryDispatcher",
    "LogicError",
    "Plan",
    "PlanFailedError",
    "PlanResult",
    "PlanStatus",
    "PlanValidationError",
    "PlanningError",
    "PolicyError",
    "Ref",
    "RefError",
    "RetryPolicy",
    "Step",
    "StepBase",
    "StepError",
    "StepEvent",
    "StepFailure",
    "StepStatus",
    "ToolContext",
    "ToolRunner",
    "ToolStep",
    "TransientError",
    "failure_class_for_code",
    "find_cycle",
    "ref",
    "refs_in",
    "resolve_refs",
    "topological_layers",
    "validate_plan",
]
