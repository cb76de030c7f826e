"""A plan waiting at a gate that asks, seen from the A2A face: ``input-required``.

``GateWatch`` follows a message's plan (through ``Watch``, authorized and audited as the caller's)
while its ``Call`` runs, and says when the plan comes to wait at a gate step that asks
(``input_schema`` or ``choices``): the handler then answers the task ``input-required`` and keeps
the Call for the next message naming the task, which answers the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Final

from stratagem.protocol._errors import RemoteError
from stratagem.protocol._models import GateInfo, PlanQuery, PlanSnapshot
from stratagem.protocol._server import AgentServer, HttpCall
from stratagem.protocol._service import PLANS, WATCH

__all__ = ["ASKS_AFTER_S", "GateWatch", "asked_at", "asks"]

ASKS_AFTER_S: Final = 0.5
"""How long a message's Call may run before the face watches its plan for a gate that asks."""


def asked_at(snapshot: PlanSnapshot) -> GateInfo | None:
    """The gate that asks at which a plan waits (its snapshot's), if any."""
    if snapshot.status != "blocked":
        return None
    open_gates = [g for g in snapshot.gates if asks(g) and g.event != "decided"]
    return open_gates[-1] if open_gates else None


def asks(gate: GateInfo) -> bool:
    """Whether a gate asks for input an A2A message can give (a gate step's value)."""
    return gate.kind == "gate" and bool(gate.input_schema_json or gate.choices_json)


class GateWatch:
    """Tells when a message's plan comes to wait at a gate that asks.

    Args:
        server: The agent's gRPC server (``Watch`` and ``Plans`` through its pipeline).
    """

    def __init__(self, server: AgentServer) -> None:
        self._server = server

    async def until_asked(
        self,
        task_id: str,
        metadata: Mapping[str, str],
        context: HttpCall,
        calling: asyncio.Future[bytes],
        *,
        answered: str = "",
    ) -> GateInfo | None:
        """The gate that asks (``input_schema`` or ``choices``) at which the task's plan comes to
        wait, or ``None`` once its Call ended first (through ``Watch``: a caller the policy
        denies ``Watch`` waits for the Call). ``answered``: a gate just decided (its opening, if
        the stream tells it again, is not a new question).

        A Call that ends within ``ASKS_AFTER_S`` (most do) is waited for without a ``Watch``
        (one more audited call each); a later one's ``Watch`` still tells a gate opened before
        it (stored events come first)."""
        await asyncio.wait({calling}, timeout=ASKS_AFTER_S)
        if calling.done():
            return None
        events = self._server.stream_foreign(
            WATCH.name,
            WATCH.encode_request(PlanQuery(plan_id=task_id)),
            metadata,
            context,
        )
        upcoming: asyncio.Future[bytes] | None = None
        try:
            while not calling.done():
                if upcoming is None:
                    upcoming = asyncio.ensure_future(anext(events))
                await asyncio.wait({upcoming, calling}, return_when=asyncio.FIRST_COMPLETED)
                if not upcoming.done():
                    break
                try:
                    raw = upcoming.result()
                except (StopAsyncIteration, RemoteError):
                    break
                upcoming = None
                event = WATCH.decode_response(raw)
                gate = event.gate
                if (
                    event.plan_id == task_id
                    and gate is not None
                    and asks(gate)
                    and gate.event in ("opened", "escalated")
                    and gate.gate_id != answered
                ):
                    # The stream may tell a gate's opening long after it was decided (stored
                    # events first): the plan's snapshot says whether it still waits there.
                    try:
                        waiting_at = await self._still_asking(task_id, metadata, context)
                    except RemoteError:  # the plan cannot be read: the stream's word stands
                        return gate
                    if waiting_at is not None and waiting_at.gate_id != answered:
                        return waiting_at
        finally:
            if upcoming is not None and not upcoming.done():
                upcoming.cancel()
                with contextlib.suppress(BaseException):
                    await upcoming
            await events.aclose()
        if not calling.done():
            await asyncio.wait({calling})
        return None

    async def _still_asking(
        self, task_id: str, metadata: Mapping[str, str], context: HttpCall
    ) -> GateInfo | None:
        """The gate that asks at which the plan waits now (its snapshot, through ``Plans``), if
        any; a plan that cannot be read is ``RemoteError``."""
        query = PLANS.encode_request(PLANS.build(plan_id=task_id, page_size=1))
        answer = await self._server.serve_foreign(PLANS.name, query, metadata, context)
        for snapshot in PLANS.decode_response(answer).plans:
            if snapshot.plan_id == task_id:
                return asked_at(snapshot)
        return None
