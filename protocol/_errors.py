"""The protocol's exceptions: one tree, one status code per remote error.

::

    ProtocolError                      base of everything protocol/ raises
    ├── ProtocolUsageError             the caller misused the API (unknown capability, bad config)
    ├── StorageError                   a store could not read or write its data (.location):
    │   ├── StorageSchemaError         a schema version this code does not read, or a failed
    │   │                              migration (.found, .known); also a ProtocolUsageError
    │   ├── StorageUnavailableError    the database cannot be opened, reached or locked
    │   └── StorageCorruptError        the database is damaged
    └── RemoteError                    a call ended with a non-OK status (.code, .message)
        ├── InvalidArgumentError       INVALID_ARGUMENT, with .violations (field, description)
        ├── UnauthenticatedError       UNAUTHENTICATED
        ├── PermissionDeniedError      PERMISSION_DENIED
        ├── NotFoundError              NOT_FOUND
        ├── FailedPreconditionError    FAILED_PRECONDITION
        ├── ResourceExhaustedError     RESOURCE_EXHAUSTED
        ├── DeadlineExceededError      DEADLINE_EXCEEDED
        ├── AbortedError               ABORTED (a plan run for RunPlan ended failed: not the
        │                              call's fault, and the same call again answers the same)
        ├── UnavailableError           UNAVAILABLE
        ├── CancelledError             CANCELLED
        └── InternalError              INTERNAL and UNKNOWN; never carries a stack trace

The storage errors live in ``_storage._errors`` (every store raises them; planning's state-store
errors derive from them). Handlers raise the ``RemoteError`` subclasses to answer with that status;
the client raises them when a call ends with it. ``Code`` names gRPC status codes without importing
``grpc``, so layers above ``protocol/`` can reason about them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

__all__ = [
    "AbortedError",
    "CancelledError",
    "Code",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FieldViolation",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ProtocolError",
    "ProtocolUsageError",
    "RemoteError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "error_for_code",
]


class Code(StrEnum):
    """gRPC status codes by name (the subset Stratagem answers with, plus OK and UNKNOWN)."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One invalid field: a dotted path (``beat.goals[0].predicate``) and why it is invalid."""

    field: str
    description: str


class ProtocolError(Exception):
    """Base of every exception raised by ``protocol``."""


class ProtocolUsageError(ProtocolError):
    """The API was misused by its caller (a bug on this side, not a remote failure)."""


class RemoteError(ProtocolError):
    """A call ended with a non-OK status.

    Attributes:
        code: The status code.
        message: A one-line, user-facing description; never a stack trace.
        violations: Field violations (for ``INVALID_ARGUMENT``).
        trace_id: The trace of the call that failed, when the caller knows it (``AgentClient``
            sets it from the call's trace context; "" otherwise): where to look for what happened.
    """

    code: ClassVar[Code] = Code.UNKNOWN

    def __init__(self, message: str, *, violations: tuple[FieldViolation, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.violations = violations
        self.trace_id = ""

    def __str__(self) -> str:
        text = f"{self.code.value}: {self.message}"
        if self.violations:
            text += " (" + "; ".join(f"{v.field}: {v.description}" for v in self.violations) + ")"
        return text


class InvalidArgumentError(RemoteError):
    """The request is malformed; ``violations`` names each invalid field."""

    code = Code.INVALID_ARGUMENT


class UnauthenticatedError(RemoteError):
    """The caller's identity is missing or malformed."""

    code = Code.UNAUTHENTICATED


class PermissionDeniedError(RemoteError):
    """The policy does not allow this caller to call this capability on this target."""

    code = Code.PERMISSION_DENIED


class NotFoundError(RemoteError):
    """The target does not serve the capability, or the plan asked about does not exist."""

    code = Code.NOT_FOUND


class FailedPreconditionError(RemoteError):
    """The request is valid but the system is not in a state to serve it."""

    code = Code.FAILED_PRECONDITION


class ResourceExhaustedError(RemoteError):
    """A message is larger than allowed, or the server is out of capacity."""

    code = Code.RESOURCE_EXHAUSTED


class DeadlineExceededError(RemoteError):
    """The call did not finish before its deadline."""

    code = Code.DEADLINE_EXCEEDED


class AbortedError(RemoteError):
    """The operation ran and was aborted: retrying the same call does not help, doing it again
    (a new request) may. ``RunPlan`` answers so for a plan that failed transiently or timed out."""

    code = Code.ABORTED


class UnavailableError(RemoteError):
    """The target is down or unreachable; retrying later may succeed."""

    code = Code.UNAVAILABLE


class CancelledError(RemoteError):
    """The call was cancelled, usually by its caller."""

    code = Code.CANCELLED


class InternalError(RemoteError):
    """The target failed unexpectedly; the message never carries a stack trace."""

    code = Code.INTERNAL


_BY_CODE: dict[Code, type[RemoteError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotFoundError,
        FailedPreconditionError,
        ResourceExhaustedError,
        DeadlineExceededError,
        AbortedError,
        UnavailableError,
        CancelledError,
        InternalError,
    )
}


def error_for_code(
    code: Code, message: str, violations: tuple[FieldViolation, ...] = ()
) -> RemoteError:
    """The ``RemoteError`` for ``code`` (``InternalError`` for a code without a class of its own).

    Args:
        code: The status code.
        message: The one-line message.
        violations: Field violations, for ``INVALID_ARGUMENT``.

    Returns:
        An instance of the code's class, else an ``InternalError`` whose message names the code.
    """
    cls = _BY_CODE.get(code, InternalError)
    err = cls(message, violations=violations)
    if cls is InternalError and code is not Code.INTERNAL:
        err.message = f"{code.value}: {message}"
    return err
