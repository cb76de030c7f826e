"""JSON payloads an agent parses (RunPlan, a replan, a gate's output) refuse hostile shapes with
``INVALID_ARGUMENT`` and a reason, over real gRPC, never ``INTERNAL``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agents import StrategicAgent
from protocol import (
    OPERATOR,
    AgentClient,
    AgentServer,
    CallerMetadataAuthenticator,
    ClientConfig,
    InMemoryAuditLog,
    InvalidArgumentError,
    Policy,
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
