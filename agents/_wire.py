"""Translation between planning and the protocol: errors, events, revisions, requests' digests.

The engine speaks ``planning`` (plans, ``FailureClass``, ``StepEvent``, ``RevisionRecord``); callers
speak the protocol (``RemoteError`` subclasses, ``PlanEvent``, ``PlanRevision``). Everything an
agent turns from one into the other is here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from pydantic import ValidationError

from stratagem.planning import (
    FailureClass,
    PlanResult,
    RevisionRecord,
    StepError,
    StepEvent,
    code_for_failure_class,
)
from stratagem.protocol import (
    CancelledError,
    CapabilitySpec,
    FieldViolation,
    InvalidArgumentError,
    PlanEvent,
    PlanRevision,
    RemoteError,
    RevisionStepChange,
    WireModel,
    error_for_code,
    json_object,
)

__all__ = [
    "MESSAGE_LIMIT",
    "coerce_request",
    "digest_of_request",
    "failure_error",
    "gate_output",
    "goal_marked",
    "invalid_argument",
    "one_line",
    "plain_goal",
    "plan_event",
    "reason_of",
    "recorded_digest",
    "revision_entry",
    "run_failure",
]

MESSAGE_LIMIT: Final = 4000
"""The longest message an agent puts in an error or an event (longer ones are cut)."""

# A durable agent ends the goal of every plan it makes for a request with the request's digest,
# so a repeated request is recognized from the store alone (see ``Agent.handle``).
_DIGEST_MARK: Final = re.compile(r" \[request ([0-9a-f]{32})\]$")

_GOAL_LIMIT: Final = 2000


def failure_error(failure_class: FailureClass, message: str) -> RemoteError:
    """The ``RemoteError`` a step failure of ``failure_class`` is reported with.

    The code comes from ``planning.FAILURE_CODES`` (``code_for_failure_class``), the table the
    engine reads the other way to classify a failed remote call.
    """
    return error_for_code(code_for_failure_class(failure_class), message)


def run_failure(result: PlanResult[Any], role: str) -> RemoteError:
    """The ``RemoteError`` for a run that did not succeed: its first failure's class, or
    ``CancelledError`` for a run cancelled without one; the message names the plan and step."""
    plan = result.submitted
    if not result.failures:
        return CancelledError(f"plan {plan.id!r} on the {role} agent was cancelled")
    first = result.failures[0]
    message = one_line(
        f"plan {plan.id!r} step {first.step_id!r} failed "
        f"({first.failure_class.value}): {first.message}"
    )
    return failure_error(first.failure_class, message)


def plan_event(event: StepEvent, role: str) -> PlanEvent:
    """The engine's event as the protocol's ``PlanEvent`` (its message cut to a wire line).

    Built without validation: every field comes from the engine's own event about a plan this agent
    validated (ids, statuses and counts within their limits), and the message is cut here. A
    watcher in another process validates it as it decodes it.
    """
    return PlanEvent.model_construct(
        plan_id=event.plan_id,
        revision=event.revision,
        step_id=event.step_id,
        status=event.status.value,
        attempt=event.attempt,
        failure_class=event.failure_class.value if event.failure_class else "",
        message=event.message[:MESSAGE_LIMIT],
        timestamp=event.timestamp,
        agent=role,
    )


def gate_output(output_json: str) -> dict[str, Any] | None:
    """A reconcile gate's output to record, from its JSON (``None`` when empty)."""
    if not output_json:
        return None
    return json_object(output_json, "output_json")


def revision_entry(record: RevisionRecord) -> PlanRevision:
    return PlanRevision(
        revision=record.revision,
        parent=record.parent or 0,
        author=record.author,
        rationale=record.rationale,
        added=list(record.diff.added),
        removed=list(record.diff.removed),
        changed=[
            RevisionStepChange(step_id=c.step_id, fields=list(c.fields))
            for c in record.diff.changed
        ],
        carried=list(record.carried),
        at=max(record.at, 0.0),
    )


def digest_of_request(capability: str, request: WireModel) -> str:
    """A digest of one capability request (its capability and canonical JSON)."""
    body = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{capability}\n{body}".encode()).hexdigest()[:32]


def goal_marked(goal: str, request_digest: str) -> str:
    """``goal`` ending with the digest of the request its plan serves."""
    mark = f" [request {request_digest}]"
    return goal[: _GOAL_LIMIT - len(mark)] + mark


def plain_goal(goal: str) -> str:
    """``goal`` without the request digest a durable agent ends it with."""
    return _DIGEST_MARK.sub("", goal)


def recorded_digest(plan_json: str) -> str | None:
    """The request digest a stored plan's goal ends with, or ``None``."""
    try:
        goal = json.loads(plan_json).get("goal", "")
    except (ValueError, RecursionError, AttributeError):
        return None
    found = _DIGEST_MARK.search(goal) if isinstance(goal, str) else None
    return found.group(1) if found else None


def one_line(text: str) -> str:
    return " ".join(text.split())[:MESSAGE_LIMIT]


def reason_of(exc: Exception) -> str:
    if isinstance(exc, StepError):
        return exc.message
    return str(exc)


def invalid_argument(what: str, exc: ValidationError) -> InvalidArgumentError:
    violations = []
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        violations.append(FieldViolation(path or "(request)", error["msg"]))
    return InvalidArgumentError(what, violations=tuple(violations))


def coerce_request(spec: CapabilitySpec, request: WireModel) -> WireModel:
    if isinstance(request, spec.request):
        return request
    try:
        return spec.request.model_validate(request.model_dump())
    except ValidationError as exc:
        raise invalid_argument(f"not a valid {spec.name} request", exc) from None
