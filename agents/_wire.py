"""Translation between planning and the protocol: errors, events, revisions, requests' digests.

The engine speaks ``planning`` (plans, ``FailureClass``, ``StepEvent``, ``RevisionRecord``); callers
speak the protocol (``RemoteError`` subclasses, ``PlanEvent``, ``PlanRevision``). Everything an
agent turns from one into the other is here.

Refusals and failures are raised as protocol ``RemoteError`` subclasses, one per failure class:

==========================  ========================================================================
situation                   raised
==========================  ========================================================================
unknown capability          ``NotFoundError``
request of the wrong model  ``InvalidArgumentError`` (with field violations)
plan fails validation       a planner's plan: ``FailedPreconditionError`` naming every problem
                            (e.g. a step naming a tool outside this agent's registry): the request
                            was well formed, the plan made for it cannot run here, so retrying the
                            same request cannot help. A user's plan (``submit_plan``, ``RunPlan``):
                            ``InvalidArgumentError``, the plan itself is the bad input.
step failed: logic          ``FailedPreconditionError``
step failed: policy         ``PermissionDeniedError``
step failed: timeout        ``DeadlineExceededError`` (``AbortedError`` for ``RunPlan``: the plan
                            ran and failed, the call did not; see ``users_run_failure``)
step failed: transient      ``UnavailableError`` (``AbortedError`` for ``RunPlan``)
plan cancelled              ``CancelledError``
control of an unknown plan  ``NotFoundError``
control refused             ``FailedPreconditionError`` (a gate not open, a finished plan, a plan
                            already running, another revision)
==========================  ========================================================================
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import time
import uuid
from typing import Any, Final

from pydantic import ValidationError

from stratagem.planning import (
    FailureClass,
    GateDecision,
    GateKind,
    GateNotice,
    GateState,
    GateStep,
    Plan,
    PlanResult,
    PlanState,
    PlanStatus,
    RevisionRecord,
    Step,
    StepError,
    StepEvent,
    StepFailure,
    StepStatus,
    ToolStep,
    code_for_failure_class,
)
from stratagem.protocol import (
    AbortedError,
    CallContext,
    CancelledError,
    CapabilitySpec,
    FailedPreconditionError,
    FieldViolation,
    GateInfo,
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
    "caller_deadline",
    "coerce_request",
    "digest_of_request",
    "failure_error",
    "gate_info",
    "gate_output",
    "goal_marked",
    "invalid_argument",
    "one_line",
    "package_version",
    "plain_goal",
    "plan_event",
    "plan_id_for",
    "reason_of",
    "recorded_digest",
    "revision_entry",
    "run_digest",
    "run_failure",
    "stored_failure",
    "stored_gate",
    "users_run_failure",
]

MESSAGE_LIMIT: Final = 4000
"""The longest message an agent puts in an error or an event (longer ones are cut)."""

# A durable agent ends the goal of every plan it makes for a request with the request's digest,
# so a repeated request is recognized from the store alone (see ``Agent.handle``).
_DIGEST_MARK: Final = re.compile(r" \[request ([0-9a-f]{32})\]$")

_GOAL_LIMIT: Final = 2000

# The failure classes whose codes ask a client to send the same call again.
_RETRIED_CLASSES: Final = frozenset({FailureClass.TRANSIENT, FailureClass.TIMEOUT})


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


def users_run_failure(result: PlanResult[Any], role: str) -> RemoteError:
    """``RunPlan``'s error for a user's plan that ran and did not succeed: ``run_failure``'s,
    except that a ``transient`` or ``timeout`` failure is ``AbortedError``, not ``UNAVAILABLE`` or
    ``DEADLINE_EXCEEDED``. The plan is over: those codes say the call did not get through (a
    client retries them, and the retry answers the same), where running the plan again is a new
    request (``plans run`` again)."""
    error = run_failure(result, role)
    if result.failures and result.failures[0].failure_class in _RETRIED_CLASSES:
        return AbortedError(error.message)
    return error


def stored_failure(state: PlanState, plan: Plan, role: str) -> RemoteError:
    """``users_run_failure`` of a user's plan that ended failed or cancelled, from its stored
    ``state``: the failure of the step that failed first (a handled one aside, which a succeeded
    plan may have too)."""
    failed = [
        StepFailure(step_id, step.failure_class, step.message, step.attempt)
        for step_id, step in sorted(
            state.steps.items(), key=lambda item: item[1].ended or float("inf")
        )
        if step.status is StepStatus.FAILED and step.failure_class is not None
    ]
    if not failed and state.status is not PlanStatus.CANCELLED:
        # Failed as a whole (its caller's deadline, a refusal): what its status record says.
        return FailedPreconditionError(
            one_line(f"plan {plan.id!r} on the {role} agent failed: {state.message}")
        )
    result: PlanResult[Any] = PlanResult(
        status=state.status,
        outputs=state.outputs,
        failures=failed[:1],
        statuses={},
        events=0,
        duration_s=0.0,
        submitted=plan,
    )
    return users_run_failure(result, role)


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
        gate=None if event.gate is None else gate_info(event.gate),
    )


def gate_info(notice: GateNotice) -> GateInfo:
    """What the engine says happened at a gate, as the protocol's ``GateInfo`` (long texts and
    values cut to the wire's limits; a value cut is no longer JSON and says so)."""
    return GateInfo.model_construct(
        gate_id=notice.gate_id,
        kind=notice.kind.value,
        event=notice.event,
        prompt=notice.prompt[:MESSAGE_LIMIT],
        deciders=list(notice.deciders),
        deadline=notice.deadline or 0.0,
        escalate_at=notice.escalate_at or 0.0,
        input_schema_json=_json_or_empty(notice.input_schema, notice.input_schema is not None),
        choices_json=_json_or_empty(
            None if notice.choices is None else list(notice.choices), notice.choices is not None
        ),
        tool=notice.tool,
        arguments_json=_json_or_empty(notice.arguments, notice.arguments is not None),
        decision=notice.decision,
        approver=notice.approver,
        rationale=notice.rationale[:MESSAGE_LIMIT],
        value_json=_json_or_empty(notice.value, notice.has_value),
        at=max(notice.at, 0.0),
    )


def stored_gate(gate: GateState, step: Step | None) -> GateInfo:
    """A gate as the store keeps it (``PlanState.gates``) and its plan's ``step`` says it, as
    the protocol's ``GateInfo``."""
    decided = gate.decision is not GateDecision.OPEN
    asks = isinstance(step, GateStep) and gate.kind is GateKind.GATE
    return GateInfo.model_construct(
        gate_id=gate.gate_id,
        kind=gate.kind.value,
        event=(
            ("timed_out" if gate.timed_out else "decided")
            if decided
            else ("escalated" if gate.escalated else "opened")
        ),
        prompt=gate.prompt[:MESSAGE_LIMIT],
        deciders=list(gate.deciders),
        deadline=gate.deadline or 0.0,
        escalate_at=gate.escalate_at or 0.0,
        input_schema_json=(
            _json_or_empty(step.input_schema, step.input_schema is not None)
            if asks and isinstance(step, GateStep)
            else ""
        ),
        choices_json=(
            _json_or_empty(step.choices, step.choices is not None)
            if asks and isinstance(step, GateStep)
            else ""
        ),
        tool=step.tool if isinstance(step, ToolStep) and gate.kind is GateKind.TOOL else "",
        arguments_json=_json_or_empty(gate.arguments, gate.arguments is not None),
        decision=gate.decision.value if decided else "",
        approver=gate.approver,
        rationale=gate.rationale[:MESSAGE_LIMIT],
        value_json=_json_or_empty(gate.value, gate.has_value),
        at=max(gate.opened_at or 0.0, 0.0),
    )


_JSON_LIMIT: Final = 65536


def _json_or_empty(value: Any, present: bool) -> str:
    if not present:
        return ""
    text = json.dumps(value, separators=(",", ":"), default=str)
    if len(text) > _JSON_LIMIT:
        return json.dumps({"cut": True, "bytes": len(text)})
    return text


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


def run_digest(caller: str, request_id: str) -> str:
    """The digest a user's plan run for ``RunPlan`` is marked with (``goal_marked``): of the
    request (its caller and id), so a retry of the same request is known from the plan itself,
    and the same plan sent by another request is another run."""
    return hashlib.sha256(f"RunPlan\n{caller}\n{request_id}".encode()).hexdigest()[:32]


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
    return marked_digest(goal) if isinstance(goal, str) else None


def marked_digest(goal: str) -> str | None:
    """The request digest ``goal`` ends with (``goal_marked``), or ``None``."""
    found = _DIGEST_MARK.search(goal)
    return found.group(1) if found else None


def caller_deadline(ctx: CallContext) -> float | None:
    """When the caller of ``ctx`` stops waiting, on the wall clock (``None``: no deadline)."""
    left = ctx.remaining()
    return None if left is None else time.time() + left


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


def package_version() -> str:
    """The installed package's version (what an agent's card says it runs)."""
    try:
        return importlib.metadata.version("stratagem")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def plan_id_for(request: WireModel, ctx: CallContext, role: str, *, served: bool) -> str:
    """The id of the plan serving ``request``: ``"<caller plan>/<caller step>"`` when the caller
    runs a plan; the plan the call names without a step when it names a capability the agent
    serves (``served``: an A2A task is that plan); else the request's own ``plan_id``; else
    ``"<role>-<random>"``."""
    if ctx.plan_id and ctx.step_id:
        return f"{ctx.plan_id}/{ctx.step_id}"
    if ctx.plan_id and served:
        return ctx.plan_id
    own = getattr(request, "plan_id", "")
    if isinstance(own, str) and own:
        return own
    return f"{role}-{uuid.uuid4().hex[:12]}"
