"""The exception tree and failure classification."""

from __future__ import annotations

import pytest

from stratagem.planning import (
    FAILURE_CODES,
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
    code_for_failure_class,
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


@pytest.mark.parametrize(
    ("failure_class", "code"),
    [
        (FailureClass.LOGIC, Code.FAILED_PRECONDITION),
        (FailureClass.POLICY, Code.PERMISSION_DENIED),
        (FailureClass.TIMEOUT, Code.DEADLINE_EXCEEDED),
        (FailureClass.TRANSIENT, Code.UNAVAILABLE),
        (FailureClass.CANCELLED, Code.CANCELLED),
    ],
)
def test_a_failure_class_is_reported_with_its_code_and_read_back_as_itself(
    failure_class: FailureClass, code: Code
) -> None:
    assert code_for_failure_class(failure_class) is code
    assert failure_class_for_code(code) is failure_class


def test_the_table_names_every_class_and_each_code_once() -> None:
    assert set(FAILURE_CODES) == set(FailureClass)
    codes = [code for listed in FAILURE_CODES.values() for code in listed]
    assert len(codes) == len(set(codes))
    for failure_class, listed in FAILURE_CODES.items():
        assert all(failure_class_for_code(code) is failure_class for code in listed)


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
