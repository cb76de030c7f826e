"""The client against a served agent: one multicallable per method, ids checked before sending."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stratagem.protocol import (
    AgentClient,
    AgentServer,
    ExtractEntitiesRequest,
    InMemoryAuditLog,
    ProtocolUsageError,
)
from tests.unit.protocol._support import SAMPLES, FakeBackend

Connect = Callable[..., AgentClient]
EXTRACT = ExtractEntitiesRequest(text="Mira waits in the hall.")


async def test_calls_reuse_one_multicallable_and_default_to_fresh_ids(
    server: AgentServer, backend: FakeBackend, audit: InMemoryAuditLog, connect: Connect
) -> None:
    client = connect(server.endpoint)
    for _ in range(3):
        assert (
            await client.call("perception", "ExtractEntities", EXTRACT)
            == (SAMPLES["ExtractEntities"][1])
        )
    assert list(client._callables) == ["Call"]
    ids = {ctx.request_id for _, _, ctx in backend.calls}
    assert len(ids) == 3
    await client.aclose()
    assert client._callables == {}


@pytest.mark.parametrize(
    ("ids", "field"),
    [
        ({"request_id": "has space"}, "request_id"),
        ({"plan_id": "-leading-dash"}, "plan_id"),
        ({"step_id": "x" * 201}, "step_id"),
    ],
)
async def test_a_malformed_id_is_a_usage_error_naming_it(
    server: AgentServer, backend: FakeBackend, connect: Connect, ids: dict[str, str], field: str
) -> None:
    with pytest.raises(
        ProtocolUsageError, match=f"invalid call to perception.ExtractEntities: {field}"
    ):
        await connect(server.endpoint).call("perception", "ExtractEntities", EXTRACT, **ids)
    assert backend.calls == []


async def test_a_malformed_caller_is_a_usage_error(server: AgentServer, connect: Connect) -> None:
    with pytest.raises(ProtocolUsageError, match="caller"):
        await connect(server.endpoint, caller="Not An Identity").call(
            "perception", "ExtractEntities", EXTRACT
        )
