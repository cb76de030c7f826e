"""Translation between planning and the protocol: errors, events, revisions, requests' digests.

The engine speaks ``planning`` (plans, ``FailureClass``, ``StepEvent``, ``RevisionRecord``); callers
speak the protocol (``RemoteError`` subclasses, ``PlanEvent``, ``PlanRevision``). Everything an
agent turns from one into the other is here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final, assert_never

from pydantic import ValidationError

from stratagem.planning import FailureClass, RevisionRecord, StepError
from stratagem.protocol import (
    CancelledError,
    CapabilitySpec,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    PermissionDeniedError,
    PlanRevision,
    RemoteError,
    RevisionStepChange,
    UnavailableError,
    WireModel,
    json_object,
)

_MESSAGE_LIMIT: Final = 4000

# A durable agent ends the goal of every plan it makes for a request with the request's digest,
# so a repeated request is recognized from the store alone (see ``Agent.handle``).
_DIGEST_MARK: Final = re.compile(r" \[request ([0-9a-f]{32})\]$")

_GOAL_LIMIT: Final = 2000


def _error_class(failure_class: FailureClass) -> type[RemoteError]:
    match failure_class:
        case FailureClass.LOGIC:
            return FailedPreconditionError
        case FailureClass.POLICY:
            return PermissionDeniedError
        case FailureClass.TIMEOUT:
            return DeadlineExceededError
        case FailureClass.TRANSIENT:
            return UnavailableError
        case FailureClass.CANCELLED:
            return CancelledError
        case _:
            assert_never(failure_class)


def _output_of(output_json: str) -> dict[str, Any] | None:
    """A reconcile gate's output to record, from its JSON (``None`` when empty)."""
    if not output_json:
        return None
    return json_object(output_json, "output_json")


def _revision_entry(record: RevisionRecord) -> PlanRevision:
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


def _request_digest(capability: str, request: WireModel) -> str:
    """A digest of one capability request (its capability and canonical JSON)."""
    body = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{capability}\n{body}".encode()).hexdigest()[:32]


def _marked(goal: str, request_digest: str) -> str:
    """``goal`` ending with the digest of the request its plan serves."""
    mark = f" [request {request_digest}]"
    return goal[: _GOAL_LIMIT - len(mark)] + mark


def _recorded_digest(plan_json: str) -> str | None:
    """The request digest a stored plan's goal ends with, or ``None``."""
    try:
        goal = json.loads(plan_json).get("goal", "")
    except (ValueError, RecursionError, AttributeError):
        return None
    found = _DIGEST_MARK.search(goal) if isinstance(goal, str) else None
    return found.group(1) if found else None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_MESSAGE_LIMIT]


def _reason(exc: Exception) -> str:
    if isinstance(exc, StepError):
        return exc.message
    return str(exc)


def _invalid(what: str, exc: ValidationError) -> InvalidArgumentError:
    violations = []
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        violations.append(FieldViolation(path or "(request)", error["msg"]))
    return InvalidArgumentError(what, violations=tuple(violations))


def _coerce(spec: CapabilitySpec, request: WireModel) -> WireModel:
    if isinstance(request, spec.request):
        return request
    try:
        return spec.request.model_validate(request.model_dump())
    except ValidationError as exc:
        raise _invalid(f"not a valid {spec.name} request", exc) from None
