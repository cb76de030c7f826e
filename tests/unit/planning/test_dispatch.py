"""The in-memory dispatcher."""

from __future__ import annotations

import pytest

from stratagem.planning import CrossAgentCall, InMemoryDispatcher
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    NotFoundError,
    UnavailableError,
    WireModel,
    remaining_time,
)
from stratagem.protocol._context import current_call


def call(target: str = "strategic", capability: str = "AnalyzeNarrative") -> CrossAgentCall:
    return CrossAgentCall(
        target=target,
        capability=capability,
        request=AnalyzeNarrativeRequest(text="Mira waits."),
        plan_id="p1",
        step_id="s1",
        request_id="p1@1:s1",
        timeout_s=5.0,
        attempt=1,
        caller="orchestrator",
    )


async def test_dispatch_calls_the_handler_with_the_call_context() -> None:
    seen: list[tuple[str, float | None, str]] = []

    async def analyze(request: WireModel) -> WireModel:
        assert isinstance(request, AnalyzeNarrativeRequest)
        ctx = current_call.get()
        assert ctx is not None
        seen.append((ctx.request_id, remaining_time(), ctx.caller))
        return AnalyzeNarrativeResponse(protagonist="mira")

    dispatcher = InMemoryDispatcher()
    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    response = await dispatcher.dispatch(call())
    assert response == AnalyzeNarrativeResponse(protagonist="mira")
    assert dispatcher.calls == [call()]
    ((request_id, remaining, caller),) = seen
    assert (request_id, caller) == ("p1@1:s1", "orchestrator")
    assert remaining is not None
    assert 4.0 < remaining <= 5.0
    assert current_call.get() is None


async def test_unknown_target_is_unavailable_and_unknown_capability_not_found() -> None:
    async def analyze(request: WireModel) -> WireModel:
        return AnalyzeNarrativeResponse()

    dispatcher = InMemoryDispatcher()
    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    with pytest.raises(UnavailableError, match="'tactical' is not reachable"):
        await dispatcher.dispatch(call(target="tactical"))
    with pytest.raises(NotFoundError, match="does not serve 'PlanNarrativeArc'"):
        await dispatcher.dispatch(call(capability="PlanNarrativeArc"))
    assert len(dispatcher.calls) == 2
