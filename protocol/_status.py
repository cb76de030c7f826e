"""The one converter between Stratagem errors and gRPC statuses, in both directions.

The server turns whatever a call raised into a status with ``as_remote_error`` + ``grpc_status``;
the client turns a failed call back into the same ``RemoteError`` class with ``from_rpc_error``.
Field violations ride in ``google.rpc.Status`` details as ``google.rpc.BadRequest``. Nothing but a
``RemoteError``'s own one-line message ever leaves the server: any other exception becomes
``INTERNAL: internal error``.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from stratagem.protocol._errors import (
    Code,
    FieldViolation,
    InternalError,
    RemoteError,
    error_for_code,
)
from stratagem.protocol._rpc import code_number

__all__ = [
    "as_remote_error",
    "from_rpc_error",
    "from_status_message",
    "grpc_status",
    "status_message",
]

logger = logging.getLogger(__name__)


def as_remote_error(exc: BaseException) -> RemoteError:
    """The error a caller is told about: a ``RemoteError`` as raised, anything else ``INTERNAL``."""
    if isinstance(exc, RemoteError):
        return exc
    return InternalError("internal error")


def grpc_status(error: RemoteError) -> Any:
    """The ``grpc.Status`` to abort a call with: code, message and ``BadRequest`` details."""
    return rpc_status.to_status(status_message(error))


def status_message(error: RemoteError) -> status_pb2.Status:
    """The ``google.rpc.Status`` of ``error``: code, message and ``BadRequest`` details (what a
    call on a ``CallStream`` answers with)."""
    status = status_pb2.Status(code=code_number(error.code), message=error.message)
    if error.violations:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=violation.field, description=violation.description
                    )
                    for violation in error.violations
                ]
            )
        )
        status.details.append(detail)
    return status


def _violations(exc: Any) -> tuple[FieldViolation, ...]:
    try:
        status = rpc_status.from_call(exc)
    except (ValueError, DecodeError):
        logger.warning("ignoring malformed status details from %s", exc.code())
        return ()
    if status is None:
        return ()
    return _status_violations(status)


def _status_violations(status: status_pb2.Status) -> tuple[FieldViolation, ...]:
    violations: list[FieldViolation] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend(
                FieldViolation(field=item.field, description=item.description)
                for item in bad_request.field_violations
            )
    return tuple(violations)


def from_rpc_error(exc: grpc.aio.AioRpcError) -> RemoteError:
    """The ``RemoteError`` for a failed call, with the field violations its details carry."""
    code = Code(exc.code().name) if exc.code().name in Code.__members__ else Code.UNKNOWN
    message = exc.details() or code.value.replace("_", " ").lower()
    return error_for_code(code, message, _violations(exc))


_CODES: Final = {code_number(code): code for code in Code}


def from_status_message(data: bytes) -> RemoteError:
    """The ``RemoteError`` of a failed call's serialized ``google.rpc.Status`` (a ``CallStream``
    answer's), with the field violations its details carry."""
    status = status_pb2.Status()
    try:
        status.ParseFromString(data)
    except DecodeError:
        return InternalError("malformed status in a call stream's answer")
    code = _CODES.get(status.code, Code.UNKNOWN)
    if code is Code.OK:
        return InternalError("a call stream's answer carries an error status of OK")
    message = status.message or code.value.replace("_", " ").lower()
    try:
        violations = _status_violations(status)
    except DecodeError:
        logger.warning("ignoring malformed status details of %s", code)
        violations = ()
    return error_for_code(code, message, violations)
