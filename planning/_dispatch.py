"""How the engine sends a cross-agent step: the ``Dispatcher`` protocol and an in-memory one.

``runtime/`` provides the gRPC dispatcher; tests (and single-process setups) use
``InMemoryDispatcher``, which calls registered handlers directly with the same error semantics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from stratagem.protocol import NotFoundError, UnavailableError, WireModel
from stratagem.protocol._context import CallContext, current_call

__all__ = ["CrossAgentCall", "Dispatcher", "Handler", "InMemoryDispatcher", "step_run_id"]

logger = logging.getLogger(__name__)

Handler = Callable[[WireModel], Awaitable[WireModel]]
"""An in-memory capability handler: the validated request in, the response out."""


def step_run_id(plan_id: str, revision: int, step_id: str) -> str:
    """The id of one step of one plan revision: ``f"{plan_id}@{revision}:{step_id}"``.

    It is the same on every attempt, so it serves as the idempotency key of the step's request.
    """
    return f"{plan_id}@{revision}:{step_id}"


@dataclass(frozen=True, slots=True)
class CrossAgentCall:
    """One attempt of a cross-agent step, as handed to a ``Dispatcher``.

    Attributes:
        target: The role of the agent to call.
        capability: The capability's name.
        request: The validated request model.
        plan_id: The calling plan.
        step_id: The calling step.
        request_id: The idempotency key, ``f"{plan_id}@{revision}:{step_id}"``; the same on retries.
        timeout_s: Seconds left for the call (the step's timeout), or ``None`` for no limit.
        attempt: The attempt number, from 1.
        caller: The role of the calling agent ("" when unknown).
    """

    target: str
    capability: str
    request: WireModel
    plan_id: str
    step_id: str
    request_id: str
    timeout_s: float | None
    attempt: int
    caller: str = ""


class Dispatcher(Protocol):
    """Sends a cross-agent request and returns the typed response.

    Failures are raised as protocol ``RemoteError`` subclasses; the engine classifies them by code.
    """

    async def dispatch(self, call: CrossAgentCall) -> WireModel:
        """Send ``call`` and return the response model.

        Raises:
            protocol.RemoteError: When the call ends with a non-OK status.
        """
        ...


class InMemoryDispatcher:
    """A ``Dispatcher`` that calls registered async handlers in this process.

    A target with no handler at all is ``UNAVAILABLE`` (like a dead agent); a known target without
    the capability is ``NOT_FOUND``. Each handler runs with ``protocol.current_call`` set, so nested
    calls see the deadline, as they would behind the gRPC server.

    Attributes:
        calls: Every call received, in order (for tests).
    """

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._targets: set[str] = set()
        self.calls: list[CrossAgentCall] = []

    def register(self, target: str, capability: str, handler: Handler) -> None:
        """Serve ``capability`` as the agent ``target`` with ``handler``.

        Args:
            target: The serving role.
            capability: The capability's name.
            handler: ``async handler(request) -> response``.
        """
        self._handlers[(target, capability)] = handler
        self._targets.add(target)

    async def dispatch(self, call: CrossAgentCall) -> WireModel:
        """Run the registered handler for ``call``.

        Raises:
            protocol.UnavailableError: When nothing is registered for the target.
            protocol.NotFoundError: When the target does not serve the capability.
        """
        self.calls.append(call)
        handler = self._handlers.get((call.target, call.capability))
        if handler is None:
            if call.target not in self._targets:
                raise UnavailableError(f"agent {call.target!r} is not reachable")
            raise NotFoundError(f"agent {call.target!r} does not serve {call.capability!r}")
        logger.debug("dispatch %s -> %s.%s", call.request_id, call.target, call.capability)
        deadline = None if call.timeout_s is None else time.monotonic() + call.timeout_s
        token = current_call.set(
            CallContext(
                caller=call.caller,
                target=call.target,
                capability=call.capability,
                request_id=call.request_id,
                plan_id=call.plan_id,
                step_id=call.step_id,
                deadline=deadline,
            )
        )
        try:
            return await handler(call.request)
        finally:
            current_call.reset(token)
