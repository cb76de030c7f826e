"""The operator's part that follows a plan as it runs: ``watch``, the events of a plan and of every
sub-plan it causes, from its owner and the other agents, until it ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from stratagem.protocol import PlanEvent, ProtocolError
from stratagem.runtime.operator._history import check_plan_id
from stratagem.runtime.operator._input import MAX_TIMEOUT_S, InputError, PlanNotFoundError
from stratagem.runtime.operator._link import Link
from stratagem.runtime.operator._plans import FINAL, Plans

__all__ = ["Watch"]

_DRAIN_S = 0.25
"""How long ``watch`` takes sub-plans' last events after the plan itself ended."""


class Watch:
    """A plan's events as they happen, through ``link``; ``plans`` finds who holds it."""

    def __init__(self, link: Link, plans: Plans) -> None:
        self._link = link
        self._plans = plans

    async def watch(
        self,
        plan_id: str,
        *,
        owner: str | None = None,
        sub_plans: bool = True,
        wait_s: float = 0.0,
    ) -> AsyncGenerator[PlanEvent, None]:
        """The events of ``plan_id`` and of every sub-plan it causes, on its owner and (with
        ``sub_plans``) on every other agent, as they happen, until the plan ends. Stored events
        come first: a finished plan's are replayed, and the stream ends.

        Args:
            plan_id: The plan.
            owner: Its agent, when known (else asked of every agent).
            sub_plans: Follow its sub-plans on the other agents too.
            wait_s: How long to wait for a plan no agent holds yet (one about to be submitted);
                0 does not wait.

        Raises:
            InputError: A malformed plan id, or ``wait_s`` out of range.
            PlanNotFoundError: No agent holds the plan (within ``wait_s``).
        """
        check_plan_id(plan_id)
        if owner is None:
            owner = await self._wait_for_owner(plan_id, wait_s)
        else:
            self._link.check_role(owner)
        others = [role for role in self._link.roles if role != owner] if sub_plans else []
        endpoints, _ = await self._link.find((owner, *others))
        if not others:
            async for event in self._link.client(endpoints[owner]).watch(plan_id):
                yield event
            return
        queue: asyncio.Queue[tuple[str, PlanEvent | BaseException | None]] = asyncio.Queue()

        async def pump(role: str) -> None:
            try:
                async for event in self._link.client(endpoints[role]).watch(plan_id):
                    queue.put_nowait((role, event))
            except (ProtocolError, asyncio.CancelledError) as exc:
                if role == owner and not isinstance(exc, asyncio.CancelledError):
                    queue.put_nowait((role, exc))
                    return
                if isinstance(exc, asyncio.CancelledError):
                    raise
            queue.put_nowait((role, None))

        tasks = [asyncio.create_task(pump(role)) for role in (owner, *others)]
        final: PlanEvent | None = None
        try:
            while True:
                role, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    if role == owner:
                        break
                    continue
                if role == owner and item.plan_id == plan_id and not item.step_id:
                    if item.status in FINAL:
                        final = item  # the plan's end comes last, after its sub-plans'
                        continue
                    if final is not None:  # a final status, then more: a replan went on
                        yield final
                        final = None
                yield item
            # The owner's stream ended with the plan; sub-plans' last events on the other
            # agents' streams may still be on their way: take what arrives within a moment.
            while True:
                try:
                    role, item = await asyncio.wait_for(queue.get(), _DRAIN_S)
                except TimeoutError:
                    break
                if isinstance(item, PlanEvent):
                    yield item
            if final is not None:
                yield final
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_for_owner(self, plan_id: str, wait_s: float) -> str:
        """The owner of ``plan_id``, asked again until it exists or ``wait_s`` passed."""
        if not 0 <= wait_s <= MAX_TIMEOUT_S or wait_s != wait_s:
            raise InputError(f"wait must be from 0 to {MAX_TIMEOUT_S:g} seconds, not {wait_s!r}")
        deadline = time.monotonic() + wait_s
        delay = 0.1
        while True:
            try:
                return await self._plans.owner(plan_id)
            except PlanNotFoundError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)
