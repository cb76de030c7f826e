"""What ``status`` says about an agent that is gone: Ray's death cause, in words."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray
from ray.core.generated import common_pb2

from stratagem.protocol import OPERATOR, AgentClient, AnalyzeNarrativeRequest, RemoteError
from stratagem.runtime import Deployment, LaunchError, Settings
from stratagem.runtime.host._directory import actor_name, death_cause
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
        # A dead actor's name is free again: status still lists it, says it is gone, and why.
        [gone] = [info for info in own.status(timeout_s=5) if info.role == "perception"]
        assert (gone.health, gone.state, gone.problem) == (
            "not deployed",
            "DEAD",
            "removed: killed (ray.kill) by 'stratagem down', a redeploy or by hand",
        )
        # What needs every agent (a goal) stops there, naming it, and deploys nothing.
        with pytest.raises(LaunchError, match=r"perception \(removed: killed \(ray\.kill\)"):
            own.serving_endpoints(timeout_s=5)
        assert own._handle("perception") is None
    finally:
        own.teardown()


async def _health(endpoint: str) -> str:
    async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials()) as client:
        return await client.health()


async def _work_and_read(endpoint: str) -> tuple[str, int]:
    """What a call that writes (a plan) and one that reads get from the agent at ``endpoint``."""
    async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials()) as client:
        try:
            await client.call(
                "strategic", "AnalyzeNarrative", AnalyzeNarrativeRequest(text="Mira waits.")
            )
            written = "OK"
        except RemoteError as exc:
            written = f"{exc.code}: {exc.message}"
        return written, len(await client.plans(""))


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
        served = {info.role: info for info in own.status()}
        assert asyncio.run(_work_and_read(served["strategic"].endpoint))[0] == "OK"
        plans.unlink()
        # No more work is accepted (its plans would go to a file no restart reads): every write
        # is refused naming the store, reads are still answered.
        written, _ = asyncio.run(_work_and_read(served["strategic"].endpoint))
        assert written == (
            f"FAILED_PRECONDITION: the plan store {plans} was deleted while the agent ran: it "
            "accepts no work until it is redeployed ('stratagem up --replace'), so that no plan "
            "is lost"
        )
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


def _perception(dep: Deployment) -> tuple[int, str]:
    [info] = [info for info in dep.status(timeout_s=30) if info.role == "perception"]
    return info.pid, info.health


def test_restarts_are_budgeted_per_window_and_status_says_the_agent_gave_up(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    own = Deployment(
        settings.model_copy(
            update={
                "namespace": f"budget-{uuid.uuid4().hex[:8]}",
                "state_dir": tmp_path / "state",
                "max_restarts": 1,
                "restart_window_s": 600.0,
            }
        )
    )
    try:
        own.deploy(detached=False)
        first, _ = _perception(own)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 120
        second = first
        while second == first and time.monotonic() < deadline:
            time.sleep(0.2)
            with contextlib.suppress(LaunchError):  # restarting: not in the directory yet
                pid, health = _perception(own)
                if health == "serving":
                    second = pid
        assert second != first, "the first kill was not restarted"
        # A second death within the window is one more than the budget: the agent gives up,
        # and status says so (Ray may list the dead actor, or have freed its name already).
        os.kill(second, signal.SIGKILL)
        expected = "gave up: restarted 2 times within 600 s"
        deadline = time.monotonic() + 120
        said = ""
        while expected not in said and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                said = " ".join(i.problem for i in own.status(timeout_s=5))
            except LaunchError as exc:
                said = str(exc)
        assert expected in said, said
        assert own.settings.restarts_path("perception").exists()
        # status lists the agent that gave up, with why; the others keep serving.
        infos = {info.role: info for info in own.status(timeout_s=10)}
        assert infos["perception"].health == "not deployed"
        assert infos["perception"].problem.startswith(expected)
        assert {infos[role].health for role in ("strategic", "tactical", "orchestrator")} == {
            "serving"
        }
        # A goal needs every agent: it is refused naming the one that gave up, and nothing is
        # deployed in its place (which would reset the restart count and hide why).
        with pytest.raises(LaunchError) as refused:
            own.serving_endpoints(timeout_s=10)
        assert str(refused.value).startswith(f"agents not deployed: perception ({expected}")
        assert "nothing was changed" in str(refused.value)
        [after] = [info for info in own.status(timeout_s=10) if info.role == "perception"]
        assert after.health == "not deployed"  # not redeployed in its place
        assert "gave up" in own.settings.restarts_path("perception").read_text()
    finally:
        own.teardown()


def test_an_agent_binds_the_fixed_port_it_is_given(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    own = Deployment(
        settings.model_copy(
            update={
                "namespace": f"ports-{uuid.uuid4().hex[:8]}",
                "state_dir": tmp_path / "state",
                "ports": {"perception": port},
            }
        )
    )
    try:
        infos = {info.role: info for info in own.deploy(detached=False)}
        assert infos["perception"].endpoint.endswith(f":{port}")
        assert not infos["tactical"].endpoint.endswith(f":{port}")  # the others: free ports
    finally:
        own.teardown()
