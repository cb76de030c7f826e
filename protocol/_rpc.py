"""What the client and the server agree on besides the messages: names, metadata keys, span shape.

Both ends build their spans with these helpers so a client span and its server span carry the same
attributes, and both map status codes to span status the way the OpenTelemetry RPC semantic
conventions say (a client marks every non-OK code as an error, a server only the server-side ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import grpc
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, Status, StatusCode

from stratagem.protocol._errors import Code

SERVICE: Final = "stratagem.v1.AgentService"
"""The fully qualified gRPC service name."""

CALLER_KEY: Final = "x-stratagem-caller"
TARGET_KEY: Final = "x-stratagem-target"
CAPABILITY_KEY: Final = "x-stratagem-capability"
REQUEST_ID_KEY: Final = "x-stratagem-request-id"
"""Optional: lets a call refused before its body is decoded still be audited under its id."""
DELEGATION_KEY: Final = "x-stratagem-delegation"
"""Who asked on whose behalf, outermost first, comma-separated (the envelope's ``delegation``)."""
VERSION_KEY: Final = "x-stratagem-capability-version"
"""The capability's schema version the caller speaks; another version is refused before decoding."""
# Keepalive: a peer that vanishes without closing its connection is noticed within ~20 s even
# with no call in flight, instead of when a deadline runs out.
KEEPALIVE_OPTIONS: Final = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # grpcio waits this long for a ping's answer (60 s by default, whatever the timeout above).
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_KEEPALIVE_OPTIONS: Final = (
    # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, whose key is this string: pings of a
    # call that sends no data for longer than the default (5 min) would otherwise count as strikes,
    # and the server ends such a call with GOAWAY "too_many_pings" after ~30 s.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
)

# Codes a server reports as span errors (OpenTelemetry RPC semantic conventions, gRPC section).
_SERVER_ERRORS: Final = frozenset(
    {
        Code.UNKNOWN,
        Code.DEADLINE_EXCEEDED,
        Code.UNIMPLEMENTED,
        Code.INTERNAL,
        Code.UNAVAILABLE,
        Code.DATA_LOSS,
    }
)

Metadata = Sequence[tuple[str, str | bytes]]


def method_path(method: str) -> str:
    """The gRPC path of an ``AgentService`` method, e.g. ``/stratagem.v1.AgentService/Call``."""
    return f"/{SERVICE}/{method}"


def span_name(method: str) -> str:
    """The span name of an ``AgentService`` method, e.g. ``stratagem.v1.AgentService/Call``."""
    return f"{SERVICE}/{method}"


def code_number(code: Code) -> int:
    """gRPC's numeric value of ``code`` (``rpc.grpc.status_code``)."""
    return int(grpc.StatusCode[code.value].value[0])


def stratagem_attributes(**values: str) -> dict[str, str]:
    """``stratagem.*`` attributes: ``plan_id="p"`` -> ``stratagem.plan.id``; empties dropped."""
    return {"stratagem." + name.replace("_", "."): value for name, value in values.items() if value}


def span_attributes(method: str, **values: str) -> dict[str, str]:
    """The attributes an ``AgentService`` span starts with: the RPC ones and ``stratagem.*``."""
    return {
        "rpc.system": "grpc",
        "rpc.service": SERVICE,
        "rpc.method": method,
        **stratagem_attributes(**values),
    }


def end_span(span: Span, code: Code, message: str, *, server: bool) -> None:
    """Record a call's outcome on its span: the status code and, when it is an error, the status."""
    span.set_attribute("rpc.grpc.status_code", code_number(code))
    if code is Code.OK:
        return
    if not server or code in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, f"{code.value}: {message}"))


def text_metadata(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The text entries of gRPC metadata (binary ``-bin`` entries are left out), last one wins."""
    return {key: value for key, value in metadata if isinstance(value, str)}


class MetadataGetter(Getter[Metadata]):
    """Reads W3C trace context (``traceparent``, ``tracestate``) out of gRPC metadata."""

    def get(self, carrier: Metadata, key: str) -> list[str] | None:
        """Every text value of ``key``, or ``None`` when it is absent."""
        values = [value for name, value in carrier if name == key and isinstance(value, str)]
        return values or None

    def keys(self, carrier: Metadata) -> list[str]:
        """The keys present in the metadata."""
        return [name for name, _ in carrier]


metadata_getter: Final = MetadataGetter()
