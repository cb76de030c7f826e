"""Running one goal through the orchestrator, with live progress from every agent's Watch stream,
under one trace whose id is known before the goal starts (``root_span``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    ClientConfig,
    Credentials,
    DeadlineExceededError,
    PlanEvent,
    PlanSnapshot,
    PlansQuery,
    ProtocolError,
    RemoteError,
    SubmitGoalRequest,
    SubmitGoalResponse,
)
from stratagem.runtime.config._deployed import read_record
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._history import PlanView, plan_history, plan_view

__all__ = [
    "GoalOutcome",
    "GoalStarted",
    "goal_deadline_s",
    "goal_plans",
    "new_goal_id",
    "planning_timeouts",
    "root_span",
    "run_goal",
    "start_goal",
    "where_the_time_went",
]

_LOOK_S = 5.0
"""How long, after a goal's deadline passed, the agents are asked where it was."""


def planning_timeouts(settings: Settings, roles: Sequence[str]) -> dict[str, float]:
    """How long each deployed agent may take to plan one request (``planning_timeout_s``), from
    what the deployment already knows, asking no agent: what ``stratagem up`` recorded in the
    state directory (``config._deployed``: the agents' own settings, not this shell's), else
    ``settings`` for each of ``roles`` (a deployment started otherwise)."""
    record = read_record(settings.state_dir)
    if record is not None and record.planning_timeout_s is not None:
        return dict(record.planning_timeout_s)
    return {role: settings.planning_timeout_s(role) for role in roles}


def goal_deadline_s(
    base_s: float, planning_timeout_s: Mapping[str, float], goal: SubmitGoalRequest
) -> float:
    """A goal's default deadline that fits the deployment's planners: ``base_s``
    (``STRATAGEM_REQUEST_TIMEOUT_S``) plus each agent's ``planning_timeout_s`` (role -> seconds,
    0 for one that plans with its rules: ``planning_timeouts``) for every request a goal makes it
    plan (one per beat for the tactical agent, one for each other agent): a model-planned
    deployment gets the model's limits."""
    extra = sum(
        seconds * (goal.beats if role == "tactical" else 1)
        for role, seconds in planning_timeout_s.items()
    )
    return base_s + extra


logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GoalOutcome:
    """What a goal produced: the orchestrator's answer, every agent's plans, the trace id.

    Attributes:
        plan_id: The goal's plan (the orchestrator's).
        trace_id: The goal's trace (32 hex characters; one is made when this process does not
            trace, so the agents' spans still share it).
        response: The orchestrator's answer.
        plans: The goal's plan and every sub-plan it caused, from the agents' histories: what
            each step did.
    """

    plan_id: str
    trace_id: str
    response: SubmitGoalResponse
    plans: list[PlanView]


@dataclass(frozen=True, slots=True)
class GoalStarted:
    """A goal the orchestrator runs, started without waiting for it (``submit --detach``).

    Attributes:
        plan_id: The goal's plan (the orchestrator's).
        trace_id: The goal's trace.
        status: The plan's status when the orchestrator answered (``running``, or final).
    """

    plan_id: str
    trace_id: str
    status: str


def new_goal_id() -> str:
    """A fresh goal plan id, ``goal-<12 hex>``."""
    return f"goal-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def root_span(name: str, attributes: dict[str, str]) -> Iterator[str]:
    """A span that roots a trace the CLI or a client starts (a goal, a plan run), current for the
    block; yields its trace id.

    When this process does not trace (no OpenTelemetry SDK set up), the span is a non-recording
    one with a fresh trace id, current all the same: the calls made under it carry its context,
    so the agents' spans share that trace and the id printed is the one they recorded.
    """
    tracer = trace.get_tracer("stratagem.cli")
    with tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attributes) as span:
        context = span.get_span_context()
        if context.is_valid:
            yield f"{context.trace_id:032x}"
            return
        made = SpanContext(
            trace_id=random.getrandbits(128) or 1,
            span_id=random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        token = context_api.attach(trace.set_span_in_context(NonRecordingSpan(made)))
        try:
            yield f"{made.trace_id:032x}"
        finally:
            context_api.detach(token)


async def goal_plans(clients: Iterable[AgentClient], plan_id: str) -> list[PlanView]:
    """The goal's plan and its sub-plans, from every agent's history (each step's record)."""
    views: list[PlanView] = []
    for client in clients:
        token = ""
        while True:
            page = await client.history(PlansQuery(plan_id=plan_id, view="steps", page_token=token))
            views.extend(plan_view(snapshot) for snapshot in page.plans)
            token = page.next_page_token
            if not token:
                break
    return plan_history(plan_id, views, []).plans


async def _watch(client: AgentClient, plan_id: str, on_event: Callable[[PlanEvent], None]) -> None:
    with contextlib.suppress(ProtocolError, asyncio.CancelledError):
        async for event in client.watch(plan_id):
            on_event(event)


async def run_goal(
    endpoints: dict[str, str],
    request: SubmitGoalRequest,
    *,
    timeout_s: float,
    on_event: Callable[[PlanEvent], None] | None = None,
    credentials: Credentials | None = None,
    planners: Mapping[str, str] | None = None,
) -> GoalOutcome:
    """Submit ``request`` to the orchestrator and wait for its answer.

    One span (``goal``) is the root of the whole trace: the orchestrator's server span, its plan,
    and every cross-agent hop below it are its descendants.

    Args:
        endpoints: Each agent's gRPC endpoint, by role (the orchestrator's among them); every
            agent's plans for the goal are watched and gathered.
        request: The goal; its ``plan_id`` is chosen here when empty, so progress can be watched
            before the plan starts.
        timeout_s: Deadline for the whole goal.
        on_event: Called with every plan event from every agent while the goal runs.
        credentials: The operator's credentials (``None`` when authentication is off).
        planners: How each agent plans (``deterministic`` or ``model``), for the line a goal out
            of time ends with; when ``None`` the agents' cards are asked then.

    Raises:
        protocol.RemoteError: The orchestrator refused or failed the goal; its ``trace_id`` is
            the goal's trace (``stratagem trace ID`` shows it).
    """
    plan_id = request.plan_id or new_goal_id()
    request = request.model_copy(update={"plan_id": plan_id})
    config = ClientConfig(default_timeout_s=timeout_s)
    clients = {
        role: AgentClient(endpoints[role], caller=OPERATOR, credentials=credentials, config=config)
        for role in endpoints
    }
    watchers: list[asyncio.Task[None]] = []
    try:
        with root_span(
            f"goal {request.goal}",
            {"stratagem.plan.id": plan_id, "gen_ai.operation.name": "invoke_agent"},
        ) as trace_id:
            span = trace.get_current_span()
            if on_event is not None:
                watchers = [
                    asyncio.create_task(_watch(client, plan_id, on_event))
                    for client in clients.values()
                ]
                # Give the streams a moment to open so the first transitions are not missed;
                # Watch replays stored events anyway, so this is only about latency.
                await asyncio.sleep(0.05)
            started = time.monotonic()
            try:
                response = await clients["orchestrator"].call(
                    "orchestrator", "SubmitGoal", request, timeout=timeout_s
                )
            except DeadlineExceededError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                exc.trace_id = trace_id
                if time.monotonic() - started < timeout_s * 0.99:
                    raise  # an agent's own limit, named by the agent
                late = DeadlineExceededError(
                    await where_the_time_went(clients, plan_id, timeout_s, planners=planners)
                )
                late.trace_id = trace_id
                raise late from exc
            except RemoteError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                exc.trace_id = trace_id
                raise
            except ProtocolError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
            assert isinstance(response, SubmitGoalResponse)
        plans = await goal_plans(clients.values(), plan_id)
        return GoalOutcome(plan_id=plan_id, trace_id=trace_id, response=response, plans=plans)
    finally:
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in clients.values():
            await client.aclose()


async def where_the_time_went(
    clients: Mapping[str, AgentClient],
    plan_id: str,
    timeout_s: float,
    *,
    planners: Mapping[str, str] | None = None,
) -> str:
    """One line saying where a goal was when its ``timeout_s`` deadline passed: which agent and
    step was waiting, on what, and which flag or setting gives it longer (the goal's plans asked
    of the agents with a short deadline of its own; how each plans is ``planners``, else asked of
    their cards too; what they cannot tell is left out)."""

    async def ask(role: str, client: AgentClient) -> tuple[str, list[PlanSnapshot], str]:
        try:
            async with asyncio.timeout(_LOOK_S):
                plans = await client.plans(plan_id, timeout=_LOOK_S)
                if planners is not None:
                    return role, plans, planners.get(role, "")
                card = await client.describe(timeout=_LOOK_S)
            return role, plans, card.planner
        except (ProtocolError, TimeoutError):
            return role, [], (planners or {}).get(role, "")

    found = await asyncio.gather(*(ask(role, c) for role, c in clients.items()))
    plans = {s.plan_id: s for _, got, _ in found for s in got}
    how = {role: planner for role, _, planner in found}
    where = _waiting(plan_id, "orchestrator", plans, how)
    advice = (
        "give it longer with --timeout SECONDS (Python: timeout=); the default is "
        "STRATAGEM_REQUEST_TIMEOUT_S plus each model planner's limits (STRATAGEM_MODEL_TIMEOUT_S "
        "x (1 + STRATAGEM_MODEL_MAX_REPAIRS))"
    )
    return f"goal {plan_id}: the {timeout_s:g} s deadline passed while {where}; {advice}"


def _waiting(
    plan_id: str, role: str, plans: dict[str, PlanSnapshot], planners: dict[str, str]
) -> str:
    """Where ``plan_id`` (``role``'s) was waiting: down the running cross-agent steps to the
    deepest agent that was still planning or running a step."""
    snapshot = plans.get(plan_id)
    if snapshot is None:
        how = (
            " with its model (waiting on the model server)" if planners.get(role) == "model" else ""
        )
        return f"the {role} agent was still planning {plan_id}{how}"
    running = _running_steps(snapshot)
    if not running:
        return f"the {role} agent's plan {plan_id} was {snapshot.status}"
    places = []
    for step in running[:2]:
        target = step.get("target")
        if step.get("kind") == "cross_agent" and target == "a2a":
            agent = (step.get("request") or {}).get("agent")
            places.append(
                f"step '{step['id']}' of {plan_id} waited on the external A2A agent {agent!r} "
                "(its timeout_s in STRATAGEM_A2A_AGENTS bounds each attempt)"
            )
        elif step.get("kind") == "cross_agent" and isinstance(target, str):
            places.append(
                f"step '{step['id']}' of {plan_id} waited on {target}.{step.get('capability')}: "
                + _waiting(f"{plan_id}/{step['id']}", target, plans, planners)
            )
        else:
            places.append(
                f"the {role} agent's step '{step['id']}' of {plan_id} was running"
                + (f" tool {step['tool']}" if step.get("tool") else "")
            )
    return "; ".join(places)


def _running_steps(snapshot: PlanSnapshot) -> list[dict[str, Any]]:
    try:
        steps = json.loads(snapshot.plan_json).get("steps", [])
    except (ValueError, AttributeError):
        return []
    # "cancelled": started, then cut when the goal's caller went away (the plan is cancelled at
    # the same deadline); "skipped" steps never started.
    return [
        s
        for s in steps
        if isinstance(s, dict)
        and s.get("status") in ("running", "retrying", "blocked", "cancelled")
    ]


async def start_goal(
    endpoint: str,
    request: SubmitGoalRequest,
    *,
    timeout_s: float,
    credentials: Credentials | None = None,
) -> GoalStarted:
    """Submit ``request`` to the orchestrator at ``endpoint`` detached: the orchestrator answers
    once the goal's plan runs, and the goal runs on, bound by no caller's deadline.

    Raises:
        protocol.RemoteError: The goal was refused or failed before it ran (its ``trace_id``
            names the goal's trace).
    """
    plan_id = request.plan_id or new_goal_id()
    request = request.model_copy(update={"plan_id": plan_id, "detach": True})
    client = AgentClient(
        endpoint,
        caller=OPERATOR,
        credentials=credentials,
        config=ClientConfig(default_timeout_s=timeout_s),
    )
    try:
        with root_span(
            f"goal {request.goal}",
            {"stratagem.plan.id": plan_id, "gen_ai.operation.name": "invoke_agent"},
        ) as trace_id:
            try:
                response = await client.call(
                    "orchestrator", "SubmitGoal", request, timeout=timeout_s
                )
            except RemoteError as exc:
                exc.trace_id = trace_id
                raise
            assert isinstance(response, SubmitGoalResponse)
            return GoalStarted(plan_id, trace_id, response.status)
    finally:
        await client.aclose()
