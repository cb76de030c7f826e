"""The engine's failure policy: what follows a failure, decided in one place."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.planning import FailureClass, RetryPolicy, StepFailure, ToolStep
from stratagem.planning import _engine as engine_package
from stratagem.planning._engine._policy import Action, FailurePolicy

POLICY = FailurePolicy()
THREE = RetryPolicy(max_attempts=3)


def step(**fields: Any) -> ToolStep:
    return ToolStep(id="s", tool="t", retry=THREE, **fields)


def test_the_engine_package_exports_only_the_public_engine_names() -> None:
    assert sorted(engine_package.__all__) == [
        "CircuitBreakerConfig",
        "Engine",
        "EngineConfig",
        "GateNotice",
        "GateNotifier",
        "PlanResult",
        "StepEvent",
        "ToolApproval",
        "ToolContext",
        "ToolRunner",
    ]


@pytest.mark.parametrize("failure_class", [FailureClass.TRANSIENT, FailureClass.TIMEOUT])
def test_transient_and_timeout_failures_retry_until_the_attempts_run_out(
    failure_class: FailureClass,
) -> None:
    assert POLICY.after_attempt(step(), failure_class, 1) is Action.RETRY
    assert POLICY.after_attempt(step(), failure_class, 2) is Action.RETRY
    assert POLICY.after_attempt(step(), failure_class, 3) is Action.FAIL


@pytest.mark.parametrize(
    "failure_class", [FailureClass.LOGIC, FailureClass.POLICY, FailureClass.CANCELLED]
)
def test_other_failures_are_not_retried(failure_class: FailureClass) -> None:
    assert POLICY.after_attempt(step(), failure_class, 1) is Action.FAIL


def test_a_policy_failure_is_held_at_a_gate_when_the_step_asks_for_one() -> None:
    gated = step(on_policy_failure="gate")
    assert POLICY.after_attempt(gated, FailureClass.POLICY, 1) is Action.GATE
    assert POLICY.after_attempt(gated, FailureClass.LOGIC, 1) is Action.FAIL
    assert POLICY.after_denial(gated, exhausted=False) is Action.GATE
    assert POLICY.after_denial(gated, exhausted=True) is Action.FAIL  # no decision refills it
    assert POLICY.after_denial(step(), exhausted=False) is Action.FAIL


def test_only_logic_failures_may_be_replanned() -> None:
    logic = StepFailure("a", FailureClass.LOGIC, "wrong plan", 1)
    policy = StepFailure("b", FailureClass.POLICY, "not allowed", 1)
    assert POLICY.may_replan([logic])
    assert not POLICY.may_replan([logic, policy])
    assert not POLICY.may_replan([])


def test_a_replanner_may_take_other_classes_but_never_a_cancellation() -> None:
    transient = StepFailure("a", FailureClass.TRANSIENT, "still down", 3)
    cancelled = StepFailure("b", FailureClass.CANCELLED, "cancelled", 1)
    assert not POLICY.may_replan([transient])
    everything = frozenset(FailureClass)
    assert POLICY.may_replan([transient], everything)
    assert not POLICY.may_replan([cancelled], everything)


def test_the_retried_classes_are_the_policys_to_choose() -> None:
    stubborn = FailurePolicy(retryable=frozenset({FailureClass.LOGIC}))
    assert stubborn.after_attempt(step(), FailureClass.LOGIC, 1) is Action.RETRY
    assert stubborn.after_attempt(step(), FailureClass.TRANSIENT, 1) is Action.FAIL
