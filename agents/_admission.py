"""What an agent checks before it runs a plan, and what it keeps of a plan it does not run.

Functions ``Agent`` calls with the few things each needs: why a plan may not run here
(``plan_problems``; for a user's plan, ``planner_fields_set`` too), the tool approvals its
policy asks (``tool_approvals``), a refused plan kept in the store with its reason
(``store_refusal``), and a request already served: its stored state (``served_before``) and the
result rebuilt from it (``stored_result``).
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from stratagem.agents._records import PlanBook
from stratagem.agents._tool import ToolRegistry
from stratagem.agents._wire import marked_digest, recorded_digest
from stratagem.planning import (
    ExpressionError,
    Plan,
    PlanResult,
    PlanState,
    PlanStatus,
    PlanStatusRecord,
    PlanValidationError,
    StateStore,
    StepFailure,
    StepStatus,
    StoreError,
    ToolApproval,
    expression,
    validate_plan,
)
from stratagem.protocol import FailedPreconditionError, Policy

__all__ = [
    "plan_problems",
    "planner_fields_set",
    "ran_for",
    "served_before",
    "store_refusal",
    "stored_result",
    "tool_approvals",
]

logger = logging.getLogger(__name__)


def plan_problems(
    plan: Plan, *, role: str, plan_type: type[Plan], registry: ToolRegistry
) -> list[str]:
    """Why the ``role`` agent may not run ``plan``: another owner, another plan type, a tool it
    does not have or a malformed DAG (empty when it may)."""
    problems: list[str] = []
    if plan.owner != role:
        problems.append(f"the plan is owned by {plan.owner!r}, not by the {role} agent")
    if not isinstance(plan, plan_type):
        problems.append(
            f"the plan is a {type(plan).__name__}; the {role} agent runs {plan_type.__name__} plans"
        )
    try:
        validate_plan(plan, tools=registry)
    except PlanValidationError as exc:
        problems.extend(exc.problems)
    return problems


def planner_fields_set(
    plan: Plan, plan_type: type[Plan], *, replacing: Plan | None = None
) -> list[str]:
    """The planner's fields a user's ``plan`` sets (one problem each; empty: none).

    The typed fields a role's plan type adds to ``Plan`` (``TacticalPlan.dependencies``,
    ``PerceptionPlan.extraction_patterns``, ...) record what the role's planner decided; neither
    the planner nor the engine acts on them in a plan a user submits (the steps alone say what
    runs), so a user's plan may not set them: accepted, they would be ignored. The plan type
    names them (``Plan.planner_fields``); an extension's plan type whose fields its tools read
    names none.

    Args:
        plan: The user's plan.
        plan_type: The agent's plan type.
        replacing: The revision a replan's ``plan`` replaces: a field it keeps as that revision
            has it (the planner's decision, as an exported plan carries it) is not the user's.
    """
    problems = []
    for name, info in type(plan).model_fields.items():
        if name not in plan.planner_fields or name not in plan.model_fields_set:
            continue
        if getattr(plan, name) == info.get_default(call_default_factory=True):
            continue  # the default, as an exported plan carries it: nothing was asked
        if replacing is not None and getattr(replacing, name, None) == getattr(plan, name):
            continue  # the replaced revision's own value: nothing new was asked
        problems.append(
            f"field {name!r} is set by the {plan.owner} agent's planner and nothing runs it in a "
            f"user's plan: leave it out (the steps say what runs)"
        )
    return problems


def tool_approvals(policy: Policy, role: str, registry: ToolRegistry) -> tuple[ToolApproval, ...]:
    """The approvals ``policy`` asks before calls of the ``role`` agent's tools (``[[approval]]``);
    a rule for a tool the agent does not have is logged.

    Raises:
        ValueError: An approval's ``when`` is not a valid expression (one line naming it).
    """
    approvals = []
    for rule in policy.approvals(role):
        if rule.when is not None:
            try:
                expression(rule.when)
            except ExpressionError as exc:
                raise ValueError(
                    f"the policy's approval of tool {rule.tool!r}: invalid when: {exc}"
                ) from None
        if rule.tool not in registry:
            logger.warning(
                "the policy asks approval of tool %r, which the %s agent does not have",
                rule.tool,
                role,
            )
        approvals.append(
            ToolApproval(
                tool=rule.tool,
                when=rule.when,
                prompt=rule.prompt,
                deciders=rule.deciders,
                timeout_s=rule.timeout_s,
                on_timeout=rule.on_timeout,
                escalate_after_s=rule.escalate_after_s,
                escalate_to=rule.escalate_to,
            )
        )
    return tuple(approvals)


async def store_refusal(store: StateStore, plan: Plan, message: str, role: str) -> None:
    """Keep ``plan``, refused before it ran, in ``store`` as failed with ``message`` (and the
    trace of the call that asked for it), so the history shows it with its reason. Nothing is
    kept while a plan of its id runs (the refusal is the request's alone); a store that cannot
    be written is logged."""
    try:
        state = await store.load(plan.id)
        if state is not None:
            if not state.status.is_final:
                return
            plan = plan.model_copy(update={"revision": max(plan.revision, state.revision + 1)})
        if await store.save_plan(plan):
            await store.commit(
                [
                    PlanStatusRecord(
                        plan.id,
                        plan.revision,
                        PlanStatus.FAILED,
                        message,
                        trace_context=_traceparent(),
                    )
                ]
            )
    except StoreError as exc:
        logger.warning("agent %s: refused plan %s not stored: %s", role, plan.id, exc)


async def served_before(
    store: StateStore, plan_id: str, capability: str, request_digest: str
) -> PlanState | None:
    """The stored state of ``plan_id`` when it already succeeded for this very request.

    This closes the gap the server's answer store leaves: when the agent died after the plan
    succeeded but before the answer was stored, the repeated request is answered from the
    plan's recorded outputs and nothing runs again.

    Raises:
        protocol.FailedPreconditionError: The plan id already served a different request, and
            that plan succeeded or is still going (a failed or cancelled one may be retried
            with another request, e.g. by a caller that replanned the step).
    """
    state = await store.load(plan_id)
    if state is None:
        return None
    recorded = recorded_digest(state.plan_json)
    if recorded is None:
        # Not made for a request (a user's plan), or stored before digests were kept.
        return None
    if recorded != request_digest:
        if state.status in (PlanStatus.FAILED, PlanStatus.CANCELLED):
            return None
        raise FailedPreconditionError(
            f"{capability}: plan {plan_id!r} was already made for a different request"
        )
    return state if state.status is PlanStatus.SUCCEEDED else None


def stored_result(state: PlanState, plan: Plan) -> PlanResult[Any]:
    """The result of ``plan``, which succeeded, from its stored ``state``."""
    return PlanResult(
        status=PlanStatus.SUCCEEDED,
        outputs=state.outputs,
        failures=[],
        statuses={
            step.id: state.steps[step.id].status if step.id in state.steps else step.status
            for step in plan.steps
        },
        events=0,
        duration_s=0.0,
        submitted=plan,
        # A plan that succeeded failed only steps that a route on failure handled.
        handled=[
            StepFailure(step_id, step.failure_class, step.message, step.attempt)
            for step_id, step in state.steps.items()
            if step.status is StepStatus.FAILED and step.failure_class is not None
        ],
    )


def _traceparent() -> str:
    """The W3C ``traceparent`` of the current span ("" outside any trace)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


async def ran_for(book: PlanBook, store: StateStore | None, plan_id: str, mark: str) -> bool:
    """Whether the newest run of ``plan_id`` is the one the request marked ``mark`` started
    (from ``book``, else from ``store``)."""
    record = book.get(plan_id)
    if record is not None:
        return marked_digest(record.plan.goal) == mark
    if store is None:
        return False
    state = await store.load(plan_id)
    return state is not None and recorded_digest(state.plan_json) == mark
