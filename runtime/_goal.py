"""Running one goal through the orchestrator, with live progress from every agent's Watch stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    ClientConfig,
    Credentials,
    PlanEvent,
    PlanSnapshot,
    ProtocolError,
    SubmitGoalRequest,
    SubmitGoalResponse,
)

__all__ = ["GoalOutcome", "run_goal"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GoalOutcome:
    """What a goal produced: the orchestrator's answer, every agent's plans, the trace id."""

    plan_id: str
    trace_id: str
    response: SubmitGoalResponse
    plans: list[PlanSnapshot]


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
        protocol.RemoteError: The orchestrator refused or failed the goal.
    """
    plan_id = request.plan_id or f"goal-{uuid.uuid4().hex[:12]}"
    request = request.model_copy(update={"plan_id": plan_id})
    config = ClientConfig(default_timeout_s=timeout_s)
    clients = {
        role: AgentClient(endpoints[role], caller=OPERATOR, credentials=credentials, config=config)
        for role in endpoints
    }
    tracer = trace.get_tracer("stratagem.cli")
    watchers: list[asyncio.Task[None]] = []
    try:
        with tracer.start_as_current_span(
            f"goal {request.goal}",
            kind=SpanKind.INTERNAL,
            attributes={"stratagem.plan.id": plan_id, "gen_ai.operation.name": "invoke_agent"},
        ) as span:
            trace_id = f"{span.get_span_context().trace_id:032x}"
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
            except ProtocolError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
            assert isinstance(response, SubmitGoalResponse)
        plans: list[PlanSnapshot] = []
        for client in clients.values():
            plans.extend(await client.plans(plan_id))
        return GoalOutcome(plan_id=plan_id, trace_id=trace_id, response=response, plans=plans)
    finally:
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in clients.values():
            await client.aclose()
