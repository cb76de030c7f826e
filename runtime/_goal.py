"""Running one goal through the orchestrator, with live progress from every agent's Watch stream,
under one trace whose id is known before the goal starts (``root_span``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
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
    PlanEvent,
    PlansQuery,
    ProtocolError,
    RemoteError,
    SubmitGoalRequest,
    SubmitGoalResponse,
)
from stratagem.runtime._history import PlanView, plan_history, plan_view

__all__ = [
    "GoalOutcome",
    "GoalStarted",
    "goal_plans",
    "new_goal_id",
    "root_span",
    "run_goal",
    "start_goal",
]

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
        status: The plan's status when it was last seen (``running``, or already final).
    """

    plan_id: str
    trace_id: str
    status: str


async def _watch(client: AgentClient, plan_id: str, on_event: Callable[[PlanEvent], None]) -> None:
    with contextlib.suppress(ProtocolError, asyncio.CancelledError):
        async for event in client.watch(plan_id):
            on_event(event)


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


async def run_goal(
    endpoints: dict[str, str],
    request: SubmitGoalRequest,
    *,
    timeout_s: float,
    on_event: Callable[[PlanEvent], None] | None = None,
    credentials: Credentials | None = None,
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

    Raises:
        protocol.RemoteError: The orchestrator refused or failed the goal; its ``trace_id`` is
            the goal's trace (``stratagem trace ID`` shows it) and the goal's plan id is in its
            message.
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
            try:
                response = await clients["orchestrator"].call(
                    "orchestrator", "SubmitGoal", request, timeout=timeout_s
                )
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


def new_goal_id() -> str:
    """A fresh goal plan id, ``goal-<12 hex>``."""
    return f"goal-{uuid.uuid4().hex[:12]}"


async def start_goal(
    endpoint: str,
    request: SubmitGoalRequest,
    *,
    timeout_s: float,
    credentials: Credentials | None = None,
) -> GoalStarted:
    """Submit ``request`` to the orchestrator at ``endpoint`` and return once its plan runs.

    The call is sent, then let go as soon as the orchestrator's first event for the plan
    arrives: the orchestrator runs an operator's goal in a task of its own, which the caller
    going away does not cancel.

    Raises:
        protocol.RemoteError: The goal was refused or failed before it was seen running (its
            ``trace_id`` names the goal's trace).
    """
    plan_id = request.plan_id or new_goal_id()
    request = request.model_copy(update={"plan_id": plan_id})
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
            seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            async def first_event() -> None:
                async for event in client.watch(plan_id):
                    if event.plan_id == plan_id and not event.step_id:
                        if not seen.done():
                            seen.set_result(event.status)
                        return

            watching = asyncio.create_task(first_event())
            await asyncio.sleep(0.05)  # let the stream open: the plan's first event is live
            call = asyncio.create_task(
                client.call("orchestrator", "SubmitGoal", request, timeout=timeout_s)
            )
            try:
                either: set[asyncio.Future[Any]] = {call, seen}
                await asyncio.wait(either, timeout=timeout_s, return_when="FIRST_COMPLETED")
                if call.done() or (seen.done() and seen.result() == "failed"):
                    response = await call  # a refusal or a fast failure: its error is raised
                    assert isinstance(response, SubmitGoalResponse)
                    return GoalStarted(plan_id, trace_id, response.status)
                status = seen.result() if seen.done() else "pending"
                return GoalStarted(plan_id, trace_id, status)
            except RemoteError as exc:
                exc.trace_id = trace_id
                raise
            finally:
                for task in (watching, call):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(watching, call, return_exceptions=True)
    finally:
        await client.aclose()
