"""The exception tree and failure classification."""

from __future__ import annotations

import pytest

from stratagem.planning import (
    FailureClass,
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
from stratagem.protocol import Code


@pytest.mark.parametrize(
    ("code", "failure_class"),
    [
        (Code.DEADLINE_EXCEEDED, FailureClass.TIMEOUT),
        (Code.UNAVAILABLE, FailureClass.TRANSIENT),
        (Code.RESOURCE_EXHAUSTED, FailureClass.TRANSIENT),
        (Code.ABORTED, FailureClass.TRANSIENT),
        (Code.INTERNAL, FailureClass.TRANSIENT),
        (Code.UNKNOWN, FailureClass.TRANSIENT),
        (Code.PERMISSION_DENIED, FailureClass.POLICY),
        (Code.UNAUTHENTICATED, FailureClass.POLICY),
        (Code.CANCELLED, FailureClass.CANCELLED),
        (Code.INVALID_ARGUMENT, FailureClass.LOGIC),
        (Code.NOT_FOUND, FailureClass.LOGIC),
        (Code.FAILED_PRECONDITION, FailureClass.LOGIC),
        (Code.ALREADY_EXISTS, FailureClass.LOGIC),
        (Code.OUT_OF_RANGE, FailureClass.LOGIC),
        (Code.UNIMPLEMENTED, FailureClass.LOGIC),
        (Code.DATA_LOSS, FailureClass.LOGIC),
    ],
)
def test_failure_class_for_code(code: Code, failure_class: FailureClass) -> None:
    assert failure_class_for_code(code) is failure_class


def test_tree() -> None:
    for cls in (PlanValidationError, RefError, PlanFailedError, StepError):
        assert issubclass(cls, PlanningError)
    for cls in (TransientError, LogicError, PolicyError):
        assert issubclass(cls, StepError)


def test_step_errors_carry_their_class() -> None:
    assert TransientError("x").failure_class is FailureClass.TRANSIENT
    assert LogicError("x").failure_class is FailureClass.LOGIC
    assert PolicyError("x").failure_class is FailureClass.POLICY
    assert StepError("x").failure_class is FailureClass.LOGIC
    err = StepError("slow", FailureClass.TIMEOUT)
    assert (err.failure_class, err.message, str(err)) == (FailureClass.TIMEOUT, "slow", "slow")


def test_plan_failed_error_names_the_failures() -> None:
    failure = StepFailure("b", FailureClass.LOGIC, "ValueError: bad", 1)
    err = PlanFailedError("p1", [failure])
    assert err.failures == [failure]
    assert str(err) == "plan 'p1' failed: step 'b' (logic, 1 attempt(s)): ValueError: bad"


def test_validation_error_lists_problems() -> None:
    err = PlanValidationError(["one", "two"])
    assert err.problems == ["one", "two"]
    assert str(err) == "one\ntwo"
