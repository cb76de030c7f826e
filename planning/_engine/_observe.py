"""Observation: the run's ``StepEvent``s and metrics, and its spans' events and links.

``_Observer`` is told about transitions (by the run's state, which makes them, and by the gates,
for decisions); it never reads the run's state and changes nothing but its own event count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, TraceFlags

from stratagem.planning._engine._types import GateNotice, StepEvent
from stratagem.planning._metrics import PlanningMetrics
from stratagem.planning._plan import FailureClass, Plan, PlanStatus, StepStatus
from stratagem.planning._store import GateKind

logger = logging.getLogger(__name__)

# Step statuses counted as a step's outcome (``stratagem.steps``).
_SETTLED: Final = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)
_FAILURE_CLASS_ATTR: Final = "stratagem.failure.class"
# Step statuses that are a ``compensation`` span event, and the event's status attribute.
_COMPENSATION_EVENT: Final = {
    StepStatus.COMPENSATING: "running",
    StepStatus.COMPENSATED: "compensated",
    StepStatus.COMPENSATION_FAILED: "failed",
}


class _Observer:
    """Observation of one run: its events (``on_event``, metrics) and the plan span's events.

    Attributes:
        events: How many events the run emitted.
        tracing: Whether the plan span records (set once it starts): step spans and span events
            are made only then.
        span: The plan span, for its events.
    """

    __slots__ = (
        "agent",
        "compensators",
        "events",
        "metrics",
        "on_event",
        "plan",
        "span",
        "tracing",
    )

    def __init__(
        self,
        plan: Plan,
        on_event: Callable[[StepEvent], None] | None,
        metrics: PlanningMetrics,
        agent: str,
    ) -> None:
        self.plan = plan
        self.on_event = on_event
        self.metrics = metrics
        self.agent = agent
        self.events = 0
        self.tracing = False
        self.span: Span = trace.INVALID_SPAN
        # Step id -> its compensating tool, for the ``compensation`` span events.
        self.compensators = {s.id: s.compensate for s in plan.steps if s.compensate is not None}

    def started(self, span: Span) -> None:
        """The plan span started: later step spans and span events go under it if it records."""
        self.span = span
        self.tracing = span.is_recording()

    def emit(
        self,
        step_id: str,
        status: StepStatus | PlanStatus,
        attempt: int,
        failure_class: FailureClass | None = None,
        message: str = "",
        delay_s: float | None = None,
        gate_kind: GateKind | None = None,
        gate: GateNotice | None = None,
    ) -> None:
        """One transition: to ``on_event``, the metrics and (some) the plan span's events
        (``gate``: what happened at a gate, carried by the event)."""
        self.events += 1
        if step_id:
            if status in _SETTLED:
                self.metrics.step_settled(self.agent, status.value)
            elif status is StepStatus.RETRYING:
                self.metrics.retried(
                    self.agent, failure_class.value if failure_class else "unknown"
                )
            if self.tracing:
                self._span_event(step_id, status, attempt, failure_class, delay_s, gate_kind)
        if self.on_event is None:
            return
        event = StepEvent(
            self.plan.id,
            self.plan.revision,
            step_id,
            status,
            attempt,
            failure_class,
            message,
            time.time(),
            delay_s,
            gate,
        )
        try:
            self.on_event(event)
        except Exception:
            logger.exception("on_event failed for plan %s event %s", self.plan.id, event)

    def gate_decided(self, gate_id: str, kind: GateKind, approve: bool, approver: str) -> None:
        """A gate was decided: an event on the plan span."""
        if self.tracing and self.span.is_recording():
            self.span.add_event(
                "gate.decided",
                {
                    "stratagem.step.id": gate_id,
                    "stratagem.gate.kind": kind.value,
                    "stratagem.gate.decision": "approved" if approve else "rejected",
                    "stratagem.gate.approver": approver,
                },
            )

    def _span_event(
        self,
        step_id: str,
        status: StepStatus | PlanStatus,
        attempt: int,
        failure_class: FailureClass | None,
        delay_s: float | None,
        gate_kind: GateKind | None,
    ) -> None:
        """Retries, gate openings and compensations as events on the plan span."""
        if not isinstance(status, StepStatus):
            return
        if status is StepStatus.RETRYING:
            name = "retry"
        elif status is StepStatus.BLOCKED:
            name = "gate.blocked"
        elif status in _COMPENSATION_EVENT:
            name = "compensation"
        else:
            return
        span = self.span
        if not span.is_recording():  # the run has ended (e.g. a late compensation event)
            return
        attributes: dict[str, str | int | float] = {
            "stratagem.step.id": step_id,
            "stratagem.step.attempt": attempt,
        }
        if name == "gate.blocked":
            attributes["stratagem.gate.kind"] = (gate_kind or GateKind.GATE).value
        elif name == "compensation":
            attributes["stratagem.compensation.status"] = (
                "retrying"
                if failure_class is not None and status is StepStatus.COMPENSATING
                else _COMPENSATION_EVENT[status]
            )
            tool = self.compensators.get(step_id)
            if tool is not None:
                attributes["gen_ai.tool.name"] = tool
        if failure_class is not None:
            attributes[_FAILURE_CLASS_ATTR] = failure_class.value
        if delay_s is not None:
            attributes["stratagem.retry.delay_s"] = delay_s
        span.add_event(name, attributes)


def _traceparent(span: Span) -> str:
    """The W3C ``traceparent`` of ``span``."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The span context a ``traceparent`` names, or ``None`` when it is malformed."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return context if context.is_valid else None


def _resume_links(trace_contexts: list[str]) -> list[Link]:
    """Links from a resumed run's plan span to the original run and to the run it continues."""
    links: list[Link] = []
    if not trace_contexts:
        return links
    first, last = trace_contexts[0], trace_contexts[-1]
    for traceparent, kind in ((first, "original"), (last, "previous")):
        context = _span_context(traceparent)
        if context is None or (kind == "previous" and last == first):
            continue
        links.append(Link(context, {"stratagem.link.kind": kind}))
    return links


def _fail_span(span: Span, failure_class: FailureClass, message: str) -> None:
    span.set_attribute(_FAILURE_CLASS_ATTR, failure_class.value)
    span.set_status(Status(StatusCode.ERROR, message))
