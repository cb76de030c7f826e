"""RPC metrics through the OpenTelemetry metrics API: call duration by capability and code, and
calls in flight.

The server and the client each hold an ``RpcMetrics`` and call ``started`` when a call begins and
``finished`` when it ends (whatever the outcome), so in-flight counts always return to zero. Names
and attributes follow the OpenTelemetry RPC semantic conventions (``rpc.server.call.duration``,
seconds), plus ``stratagem.capability``.
"""

from __future__ import annotations

from typing import Final, Literal

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from stratagem.protocol._errors import Code
from stratagem.protocol._rpc import SERVICE, code_number

__all__ = ["RpcMetrics"]

METER_NAME: Final = "stratagem.protocol"

# Seconds, from sub-millisecond local calls to the longest deadlines.
_DURATION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)


class RpcMetrics:
    """Instruments for the calls of one side (``server`` or ``client``) of ``AgentService``.

    Instruments (``{side}`` is ``server`` or ``client``):

    * ``rpc.{side}.call.duration`` histogram (seconds), by ``rpc.system``, ``rpc.service``,
      ``rpc.method``, ``rpc.grpc.status_code`` (numeric) and ``stratagem.capability`` (``Call``
      only; ``""`` otherwise).
    * ``stratagem.rpc.{side}.active_requests`` up-down counter: calls started and not finished,
      by ``rpc.method`` and ``stratagem.capability``.

    Args:
        meter_provider: Where the instruments come from; the global provider by default.
        side: ``server`` (calls served) or ``client`` (calls sent).
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        side: Literal["server", "client"] = "server",
    ) -> None:
        meter = metrics.get_meter(METER_NAME, meter_provider=meter_provider)
        self.side = side
        self._duration = meter.create_histogram(
            f"rpc.{side}.call.duration",
            unit="s",
            description=f"Duration of AgentService calls ({side} side)",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._active = meter.create_up_down_counter(
            f"stratagem.rpc.{side}.active_requests",
            unit="{request}",
            description=f"AgentService calls in flight ({side} side)",
        )
        self._active_attrs: dict[tuple[str, str], dict[str, str]] = {}

    def _in_flight_attributes(self, method: str, capability: str) -> dict[str, str]:
        key = (method, capability)
        attrs = self._active_attrs.get(key)
        if attrs is None:
            attrs = self._active_attrs[key] = {
                "rpc.method": method,
                "stratagem.capability": capability,
            }
        return attrs

    def started(self, method: str, capability: str = "") -> None:
        """A call to ``method`` (for ``Call``: of ``capability``) began."""
        self._active.add(1, self._in_flight_attributes(method, capability))

    def finished(
        self,
        method: str,
        capability: str,
        code: Code,
        seconds: float,
        *,
        started_as: str | None = None,
    ) -> None:
        """The call ``started`` announced ended with ``code`` after ``seconds``.

        ``started_as`` is the capability ``started`` was given when it differs (a server learns
        a call's capability only once it is authorized, and never labels with an unvetted one).
        """
        in_flight = capability if started_as is None else started_as
        self._active.add(-1, self._in_flight_attributes(method, in_flight))
        self._duration.record(
            seconds,
            {
                "rpc.system": "grpc",
                "rpc.service": SERVICE,
                "rpc.method": method,
                "rpc.grpc.status_code": code_number(code),
                "stratagem.capability": capability,
            },
        )
