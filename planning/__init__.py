"""Plan models, DAG algorithms, validation, failure classes and the engine that runs plans.

The public names are re-exported here; the ``_module.py`` files are private. ``docs/internals.md``
describes how the names fit the layers around this one.
"""

from typing import TYPE_CHECKING

from stratagem.planning._dag import find_cycle, topological_layers
from stratagem.planning._dispatch import CrossAgentCall, Dispatcher, Handler, InMemoryDispatcher
from stratagem.planning._engine import (
    CircuitBreakerConfig,
    Engine,
    EngineConfig,
    PlanResult,
    StepEvent,
    ToolContext,
    ToolRunner,
)
from stratagem.planning._errors import (
    FAILURE_CODES,
    GateDecisionError,
    LogicError,
    PlanControlError,
    PlanFailedError,
    PlanningError,
    PlanValidationError,
    PolicyError,
    RefError,
    StepError,
    StepFailure,
    StoreError,
    StoreSchemaError,
    TransientError,
    code_for_failure_class,
    failure_class_for_code,
)
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import (
    STEP_ID_PATTERN,
    Budget,
    CrossAgentStep,
    FailureClass,
    GateStep,
    ModelCall,
    Plan,
    PlanStatus,
    Provenance,
    RetryPolicy,
    Step,
    StepBase,
    StepStatus,
    ToolStep,
)
from stratagem.planning._refs import Ref, ref, refs_in, resolve_refs
from stratagem.planning._replay import Divergence, ReplayReport, replay
from stratagem.planning._revisions import (
    Replanner,
    Revision,
    RevisionDiff,
    RevisionRecord,
    StepChange,
    diff_plans,
    unchanged_steps,
)
from stratagem.planning._sqlite_store import SqliteStateStore
from stratagem.planning._store import (
    BreakerState,
    BudgetRecord,
    CompensationRecord,
    CompensationState,
    CompensationStatus,
    ControlRecord,
    GateDecision,
    GateKind,
    GateRecord,
    GateState,
    InMemoryStateStore,
    PlanState,
    PlanStatusRecord,
    Record,
    StateStore,
    StepIntent,
    StepResult,
    StepState,
    StoreStats,
)
from stratagem.planning._validate import validate_plan
from stratagem.protocol._lazy import lazy_exports

if TYPE_CHECKING:
    from stratagem.planning._pg_store import PostgresStateStore

# The PostgreSQL backend needs psycopg, which the `postgres` extra installs: imported on first use,
# so that the package works without it.
__getattr__ = lazy_exports(__name__, {"PostgresStateStore": "._pg_store"})

__all__ = [
    "FAILURE_CODES",
    "STEP_ID_PATTERN",
    "BreakerState",
    "Budget",
    "BudgetRecord",
    "CircuitBreakerConfig",
    "CompensationRecord",
    "CompensationState",
    "CompensationStatus",
    "ControlRecord",
    "CrossAgentCall",
    "CrossAgentStep",
    "Dispatcher",
    "Divergence",
    "Engine",
    "EngineConfig",
    "FailureClass",
    "GateDecision",
    "GateDecisionError",
    "GateKind",
    "GateRecord",
    "GateState",
    "GateStep",
    "Handler",
    "InMemoryDispatcher",
    "InMemoryStateStore",
    "LogicError",
    "ModelCall",
    "Plan",
    "PlanControlError",
    "PlanFailedError",
    "PlanResult",
    "PlanState",
    "PlanStatus",
    "PlanStatusRecord",
    "PlanValidationError",
    "PlanningError",
    "PlanningMetrics",
    "PolicyError",
    "PostgresStateStore",
    "Provenance",
    "Record",
    "Ref",
    "RefError",
    "Replanner",
    "ReplayReport",
    "RetryPolicy",
    "Revision",
    "RevisionDiff",
    "RevisionRecord",
    "SqliteStateStore",
    "StateStore",
    "Step",
    "StepBase",
    "StepChange",
    "StepError",
    "StepEvent",
    "StepFailure",
    "StepIntent",
    "StepResult",
    "StepState",
    "StepStatus",
    "StoreError",
    "StoreSchemaError",
    "StoreStats",
    "ToolContext",
    "ToolRunner",
    "ToolStep",
    "TransientError",
    "code_for_failure_class",
    "diff_plans",
    "failure_class_for_code",
    "find_cycle",
    "ref",
    "refs_in",
    "replay",
    "resolve_refs",
    "topological_layers",
    "unchanged_steps",
    "validate_plan",
]
