"""What ``status`` says about an agent that is gone: Ray's death cause, in words."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray
from ray.core.generated import common_pb2

from stratagem.protocol import OPERATOR, AgentClient
from stratagem.runtime import Deployment, LaunchError, Settings
from stratagem.runtime._directory import actor_name, death_cause
from tests.integration._auth import credentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_death_causes_read_as_one_line() -> None:
    oom = common_pb2.ActorDeathCause(oom_context=common_pb2.OomContext(error_message="mem"))
    assert death_cause({"State": "DEAD", "DeathCause": oom}) == "died: out of memory"
    spent = death_cause({"State": "DEAD", "DeathCause": oom, "NumRestarts": 3})
    assert spent == "died: out of memory; restarts spent (3)"
    failed = common_pb2.ActorDeathCause(
        creation_task_failure_context=common_pb2.RayException(
            formatted_exception_string="Traceback ...\nOSError: disk full"
        )
    )
    assert death_cause({"State": "DEAD", "DeathCause": failed}) == (
        "died: its constructor failed: OSError: disk full"
    )
    assert death_cause({"State": "ALIVE", "DeathCause": oom}) == ""


def test_status_says_why_a_dead_agent_is_gone(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    own = Deployment(
        settings.model_copy(
            update={
                "namespace": f"health-{uuid.uuid4().hex[:8]}",
                "state_dir": tmp_path / "state",
                "max_restarts": 0,
            }
        )
    )
    try:
        own.deploy(detached=False)
        handle = ray.get_actor(actor_name("perception"), namespace=own.settings.namespace)
        ray.kill(handle, no_restart=True)
        # A dead actor's name is free again: status says it is gone, and why.
        with pytest.raises(LaunchError, match=r"perception \(died: killed \(ray\.kill\)\)"):
            own.status(timeout_s=5)
    finally:
        own.teardown()


async def _health(endpoint: str) -> str:
    async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials()) as client:
        return await client.health()


def test_status_reports_a_deleted_plan_store(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    own = Deployment(
        settings.model_copy(
            update={"namespace": f"store-{uuid.uuid4().hex[:8]}", "state_dir": tmp_path / "s"}
        )
    )
    try:
        assert all(info.health == "serving" for info in own.deploy(detached=False))
        plans = own.settings.plans_path("strategic")
        plans.unlink()
        infos = {info.role: info for info in own.status()}
        assert infos["strategic"].health == "not serving"
        assert infos["strategic"].problem.startswith(f"plan store missing: {plans} was deleted")
        assert infos["tactical"].health == "serving"
        assert asyncio.run(_health(infos["strategic"].endpoint)) == "NOT_SERVING"
        assert asyncio.run(_health(infos["tactical"].endpoint)) == "SERVING"
        # Ray restarts the agent after a kill -9: it opens a new, empty store in place of the
        # deleted one, and says so instead of serving with no plans.
        os.kill(infos["strategic"].pid, signal.SIGKILL)
        for _ in range(120):
            after = {info.role: info for info in own.status(timeout_s=5)}["strategic"]
            if after.pid not in (0, infos["strategic"].pid) and after.endpoint:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the strategic agent was not restarted")
        assert after.health == "not serving"
        assert after.problem.startswith(f"plan store missing: {plans} was deleted after")
        assert "this one is new and empty" in after.problem
    finally:
        own.teardown()
