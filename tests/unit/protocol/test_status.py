"""The one converter between errors and gRPC statuses, both ways, without a socket."""

from __future__ import annotations

import grpc
import pytest

from stratagem.protocol import (
    AbortedError,
    CancelledError,
    Code,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RemoteError,
    error_for_code,
)
from stratagem.protocol._status import as_remote_error, from_rpc_error, grpc_status


def _failed_call(status: grpc.Status) -> grpc.aio.AioRpcError:
    """The error a client sees when the server aborts with ``status``."""
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        status.details,
    )


@pytest.mark.parametrize(
    "error",
    [
        InvalidArgumentError(
            "invalid PlanExecutionSequence request",
            violations=(
                FieldViolation("beat.goals[0].predicate", "Input should be 'at' or 'in'"),
                FieldViolation("facts", "List should have at least 1 item"),
            ),
        ),
        PermissionDeniedError("'perception' may not call 'AnalyzeNarrative' on 'strategic'"),
        NotFoundError("no plan 'goal-9'"),
        CancelledError("cancelled by the caller"),
    ],
    ids=lambda error: error.code.value,
)
def test_an_error_survives_the_round_trip(error: RemoteError) -> None:
    status = grpc_status(error)
    assert status.code is grpc.StatusCode[error.code.value]
    back = from_rpc_error(_failed_call(status))
    assert type(back) is type(error)
    assert (back.message, back.violations) == (error.message, error.violations)


def test_anything_but_a_remote_error_becomes_a_bare_internal_error() -> None:
    error = as_remote_error(KeyError("secret_column"))
    assert isinstance(error, InternalError)
    assert error.message == "internal error"
    refused = NotFoundError("no such plan")
    assert as_remote_error(refused) is refused


def test_codes_without_a_class_of_their_own_are_internal_and_named() -> None:
    error = from_rpc_error(_failed_call(grpc_status(error_for_code(Code.OUT_OF_RANGE, "past"))))
    assert isinstance(error, InternalError)
    assert "OUT_OF_RANGE" in error.message


def test_aborted_has_a_class_of_its_own() -> None:
    # RunPlan's answer for a plan that ran and failed transiently (not UNAVAILABLE).
    error = from_rpc_error(_failed_call(grpc_status(AbortedError("plan 'p' step 's' failed"))))
    assert isinstance(error, AbortedError)
    assert (error.code, error.message) == (Code.ABORTED, "plan 'p' step 's' failed")


def test_a_status_from_the_transport_itself_converts() -> None:
    error = from_rpc_error(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, None))
    assert error.code is Code.UNAVAILABLE
    assert error.message == "unavailable"
    assert error.violations == ()


def test_malformed_details_are_ignored() -> None:
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", b"\xff\xfe not a status"))
    call = grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, None, trailing, "bad")
    error = from_rpc_error(call)
    assert (type(error), error.message, error.violations) == (InvalidArgumentError, "bad", ())
