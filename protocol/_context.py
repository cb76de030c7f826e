"""What a capability handler knows about the call it serves.

The server sets ``current_call`` for the handler's task; tasks the handler starts copy it, so a
nested cross-agent request made anywhere below a handler inherits the remaining deadline.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["CallContext", "current_call", "remaining_time"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """The call a handler serves.

    Attributes:
        caller: The verified identity (role) of the caller.
        target: This agent's role.
        capability: The capability asked for.
        request_id: The idempotency key of the request.
        plan_id: The caller's plan id ("" when the caller has no plan).
        step_id: The caller's step id ("" when the caller has no plan).
        deadline: Absolute deadline on the ``time.monotonic()`` clock, or ``None`` for none.
        delegation: Who asked on whose behalf before ``caller``, outermost first (verified hop by
            hop: each server checked its own caller).
    """

    caller: str
    target: str
    capability: str
    request_id: str
    plan_id: str = ""
    step_id: str = ""
    deadline: float | None = None
    delegation: tuple[str, ...] = ()

    def onward_delegation(self) -> tuple[str, ...]:
        """The delegation chain of a request made while serving this call: ours plus our caller."""
        return (*self.delegation, self.caller)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or ``None`` when there is none."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())


current_call: ContextVar[CallContext | None] = ContextVar("stratagem_current_call", default=None)


def remaining_time() -> float | None:
    """Seconds left of the call being served in this context, or ``None`` outside any call."""
    ctx = current_call.get()
    return None if ctx is None else ctx.remaining()
