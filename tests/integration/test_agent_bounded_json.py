"""JSON payloads an agent parses (RunPlan, a replan, a gate's output) refuse hostile shapes with
``INVALID_ARGUMENT`` and a reason, over real gRPC, never ``INTERNAL``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from stratagem.agents import StrategicAgent
from stratagem.agents import _records as records_module
from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ClientConfig,
    InMemoryAuditLog,
    InvalidArgumentError,
    Policy,
    ResourceExhaustedError,
)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
async def client() -> AsyncIterator[AgentClient]:
    server = AgentServer(
        StrategicAgent(),
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
    )
    async with server:
        client = AgentClient(
            server.endpoint, caller=OPERATOR, config=ClientConfig(default_timeout_s=30.0)
        )
        try:
            yield client
        finally:
            await client.aclose()


@pytest.mark.parametrize(
    ("plan_json", "reason"),
    [
        ('{"id": "p", "owner": "strategic", "steps": ' + _nested(100_000) + "}", "nested deeper"),
        ('{"id": "p", "owner": "strategic", "steps": ' + _nested(100) + "}", "nested deeper"),
        (
            '{"id": "p", "owner": "strategic", "steps": [], "n": ' + "9" * 5000 + "}",
            "cannot be read",
        ),
    ],
    ids=["nested-100000", "nested-100", "huge-int"],
)
async def test_run_plan_refuses_hostile_json_as_invalid_argument(
    client: AgentClient, plan_json: str, reason: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=reason):
        await client.run_plan(plan_json)


async def test_a_watch_stream_that_falls_behind_is_told_and_dropped(
    client: AgentClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records_module, "WATCH_QUEUE_LIMIT", 2)
    step = {
        "kind": "tool",
        "tool": "find_protagonist",
        "input": {"text": "Mira waits in the hall.", "entities": []},
    }
    plan = {
        "id": "busy",
        "owner": "strategic",
        "goal": "g",
        "steps": [dict(step, id=f"s{i}") for i in range(5)],
    }
    stream = client.watch("busy-not-yet")  # a plan that never ends here: the stream stays open
    reading = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.2)  # the stream is open (its queue registered) and nobody reads on
    await client.run_plan(json.dumps(plan))  # publishes more than 2 events meanwhile
    with pytest.raises(ResourceExhaustedError, match="fell more than 2 events behind"):
        await reading
    await stream.aclose()
