"""The perception agent's world survives a SIGKILL of its process (real Ray, real gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from stratagem.protocol import (
    AgentClient,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
)
from stratagem.runtime import Deployment, LaunchError
from tests.integration._agents import extension_deployment, kill_and_wait, pid_endpoint
from tests.integration._auth import credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REQUEST_ID = "0" * 31 + "1"
STORY = (
    "Mira waits in the courtyard. The silver crown rests in the vault. The iron key lies in the "
    "garden. The courtyard leads to the great hall. The great hall leads to the vault."
)


async def _facts(endpoint: str) -> list[object]:
    async with AgentClient(endpoint, credentials=credentials()) as client:
        answer = await client.call(
            "perception", "FindSpatialContext", FindSpatialContextRequest(entity_ids=["mira"])
        )
    assert isinstance(answer, FindSpatialContextResponse)
    return list(answer.facts)


async def test_the_world_survives_a_kill_of_the_perception_agent(
    deployment: Deployment, tmp_path: Path
) -> None:
    # `deployment`: the session's Ray, which the agents below run on.
    with extension_deployment(
        tmp_path / "state", "stratagem-world", "tests.integration.ledger_extension"
    ) as dep:
        pid, endpoint = pid_endpoint(dep, "perception")
        async with AgentClient(endpoint, credentials=credentials()) as client:
            told = await client.call(
                "perception",
                "ExtractEntities",
                ExtractEntitiesRequest(text=STORY),
                request_id=REQUEST_ID,
            )
        assert isinstance(told, ExtractEntitiesResponse)
        before = await _facts(endpoint)
        assert len(before) >= 4
        endpoint = await asyncio.to_thread(kill_and_wait, dep, pid, "perception")
        after = await _facts(endpoint)
        assert after == before
        assert (tmp_path / "state" / "perception.world.json").exists()
        print(f"world facts about mira: {len(before)} before the kill, {len(after)} after")

        # The snapshot deleted behind the agent's back, then the agent killed: the restarted
        # agent does not serve an empty world as if nothing happened; status says what was lost.
        pid, _ = pid_endpoint(dep, "perception")
        (tmp_path / "state" / "perception.world.json").unlink()
        os.kill(pid, signal.SIGKILL)
        problem = ""
        deadline = time.monotonic() + 120
        while "world snapshot missing" not in problem and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            with contextlib.suppress(LaunchError):
                [info] = [i for i in dep.status(timeout_s=30) if i.role == "perception"]
                problem = info.problem if info.pid != pid else ""
        assert "world snapshot missing" in problem
        assert "its stored answers were set aside" in problem
        assert info.health == "not serving"
        # The same request again is not answered from the stored answer of an effect that was
        # lost: it runs, and the world holds its facts again.
        assert await _facts(info.endpoint) == []
        async with AgentClient(info.endpoint, credentials=credentials()) as client:
            await client.call(
                "perception",
                "ExtractEntities",
                ExtractEntitiesRequest(text=STORY),
                request_id=REQUEST_ID,
            )
        assert await _facts(info.endpoint) == before
