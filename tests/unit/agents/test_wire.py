"""The agents' translation to the protocol: a failed run becomes the error of its failure class."""

from __future__ import annotations

import pytest

from stratagem.agents._wire import failure_error, run_failure
from stratagem.planning import FailureClass, Plan, PlanResult, PlanStatus, StepFailure
from stratagem.protocol import (
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    PermissionDeniedError,
    RemoteError,
    UnavailableError,
)


@pytest.mark.parametrize(
    ("failure_class", "error"),
    [
        (FailureClass.LOGIC, FailedPreconditionError),
        (FailureClass.POLICY, PermissionDeniedError),
        (FailureClass.TIMEOUT, DeadlineExceededError),
        (FailureClass.TRANSIENT, UnavailableError),
        (FailureClass.CANCELLED, CancelledError),
    ],
)
def test_a_step_failure_is_raised_as_the_error_of_its_class(
    failure_class: FailureClass, error: type[RemoteError]
) -> None:
    raised = failure_error(failure_class, "plan 'p' step 's' failed")
    assert type(raised) is error
    assert raised.message == "plan 'p' step 's' failed"


def _result(failures: list[StepFailure]) -> PlanResult[Plan]:
    plan = Plan(id="p", owner="strategic", goal="g")
    return PlanResult(
        status=PlanStatus.FAILED if failures else PlanStatus.CANCELLED,
        outputs={},
        failures=failures,
        statuses={},
        events=0,
        duration_s=0.0,
        submitted=plan,
    )


def test_a_failed_run_names_its_first_failure_on_one_line() -> None:
    failure = StepFailure(
        step_id="s", failure_class=FailureClass.POLICY, message="budget\nexhausted", attempts=1
    )
    raised = run_failure(_result([failure]), "strategic")
    assert isinstance(raised, PermissionDeniedError)
    assert raised.message == "plan 'p' step 's' failed (policy): budget exhausted"


def test_a_run_cancelled_without_a_failure_is_cancelled() -> None:
    raised = run_failure(_result([]), "strategic")
    assert isinstance(raised, CancelledError)
    assert raised.message == "plan 'p' on the strategic agent was cancelled"
