"""GrpcDispatcher over real gRPC: a step answered UNAVAILABLE does not end a sibling step's call
to the same agent (its channel is closed only after the calls using it have ended)."""

from __future__ import annotations

import asyncio

import pytest

from stratagem.planning import CrossAgentCall
from stratagem.protocol import (
    AgentServer,
    CallContext,
    CallerMetadataAuthenticator,
    InMemoryAuditLog,
    Policy,
    UnavailableError,
    WireModel,
)
from stratagem.runtime.host._directory import EndpointDirectory, GrpcDispatcher
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.integration


class _Fixed(EndpointDirectory):
    """One endpoint for every role, without Ray; counts how often a role was forgotten."""

    def __init__(self, endpoint: str) -> None:
        super().__init__("test")
        self.endpoint = endpoint
        self.invalidated = 0

    async def resolve(self, role: str) -> str:
        return self.endpoint

    def invalidate(self, role: str) -> None:
        self.invalidated += 1


def _call(capability: str, step: str) -> CrossAgentCall:
    return CrossAgentCall(
        caller="orchestrator",
        target="perception",
        capability=capability,
        request=SAMPLES[capability][0],
        request_id=f"goal@1:{step}",
        plan_id="goal",
        step_id=step,
        timeout_s=30,
        attempt=1,
    )


async def test_an_unavailable_sibling_does_not_cancel_a_call_in_flight() -> None:
    backend = FakeBackend("perception")
    release, started = asyncio.Event(), asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        started.set()
        await release.wait()
        return SAMPLES["ExtractEntities"][1]

    async def down(request: WireModel, ctx: CallContext) -> WireModel:
        raise UnavailableError("the model server is unreachable")

    backend.behaviour["ExtractEntities"] = slow
    backend.behaviour["FindSpatialContext"] = down
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
    )
    await server.start()
    directory = _Fixed(server.endpoint)
    dispatcher = GrpcDispatcher("orchestrator", directory)
    try:
        in_flight = asyncio.ensure_future(dispatcher.dispatch(_call("ExtractEntities", "beat_1")))
        await asyncio.wait_for(started.wait(), 30)
        with pytest.raises(UnavailableError, match="model server is unreachable"):
            await dispatcher.dispatch(_call("FindSpatialContext", "beat_2"))
        assert directory.invalidated == 1
        await asyncio.sleep(0.1)
        assert not in_flight.done()  # before: its channel was closed and the call cancelled
        release.set()
        answer = await asyncio.wait_for(in_flight, 30)
        assert answer == SAMPLES["ExtractEntities"][1]
        # The next call opens a new channel and is served.
        backend.behaviour.pop("FindSpatialContext")
        again = await dispatcher.dispatch(_call("FindSpatialContext", "beat_3"))
        assert again == SAMPLES["FindSpatialContext"][1]
        assert not dispatcher._retired  # the old channel was closed after its last call
    finally:
        release.set()
        await dispatcher.aclose()
        await server.aclose()
