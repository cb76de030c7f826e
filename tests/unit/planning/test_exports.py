"""The public names of ``planning``: adding or removing one is a deliberate change."""

from __future__ import annotations

from stratagem import planning

EXPECTED = [
    "DECIDER_PATTERN",
    "FAILURE_CODES",
    "SCHEMA_CHECK_SECONDS",
    "STEP_ID_PATTERN",
    "TIMEOUT_APPROVER",
    "BreakerState",
    "Budget",
    "BudgetRecord",
    "CircuitBreakerConfig",
    "CompensationRecord",
    "CompensationState",
    "CompensationStatus",
    "ConditionRecord",
    "ControlRecord",
    "CrossAgentCall",
    "CrossAgentStep",
    "Dispatcher",
    "Divergence",
    "Engine",
    "EngineConfig",
    "Expression",
    "ExpressionError",
    "FailureClass",
    "Fork",
    "ForkError",
    "GateDeciderError",
    "GateDecision",
    "GateDecisionError",
    "GateKind",
    "GateNotice",
    "GateNotifier",
    "GateRecord",
    "GateState",
    "GateStep",
    "GateValueError",
    "Handler",
    "HistoryQuery",
    "InMemoryDispatcher",
    "InMemoryStateStore",
    "IterationRecord",
    "LogicError",
    "LoopStep",
    "MapRecord",
    "MapStep",
    "ModelCall",
    "Plan",
    "PlanControlError",
    "PlanFailedError",
    "PlanResult",
    "PlanState",
    "PlanStatus",
    "PlanStatusRecord",
    "PlanSummary",
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
    "StoreCorruptError",
    "StoreError",
    "StoreSchemaError",
    "StoreStats",
    "StoreUnavailableError",
    "SubplanStep",
    "ToolApproval",
    "ToolContext",
    "ToolRunner",
    "ToolStep",
    "TransientError",
    "code_for_failure_class",
    "diff_plans",
    "expr",
    "expression",
    "failure_class_for_code",
    "failure_repaired",
    "find_cycle",
    "ref",
    "refs_in",
    "replan_rationale",
    "replay",
    "resolve_refs",
    "schema_errors",
    "schema_validator",
    "topological_layers",
    "unchanged_steps",
    "validate_plan",
]


def test_all_is_pinned() -> None:
    assert planning.__all__ == EXPECTED


def test_every_exported_name_exists() -> None:
    missing = [name for name in planning.__all__ if not hasattr(planning, name)]
    assert missing == []


def test_no_public_name_is_left_out() -> None:
    public = {
        name
        for name, value in vars(planning).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("planning.")
    }
    assert public <= set(planning.__all__)
