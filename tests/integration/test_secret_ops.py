"""The cluster secret on a real Ray: agents publish its key id, ``up`` refuses agents that hold
another one, ``secret rotate`` replaces it, and nothing but a deployment of its own makes one."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from stratagem.planning import Plan, PlanStatus, PlanStatusRecord, ToolStep
from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    ClusterSecret,
    IdentityKey,
    MissingSecretError,
    TokenCredentials,
    TokenSigner,
    UnauthenticatedError,
)
from stratagem.runtime import Deployment, LaunchError, Settings
from stratagem.runtime.config._stores import open_state_store
from stratagem.runtime.host._rotation import rotate_secret

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _own_deployment(settings: Settings, tmp_path: Path) -> Deployment:
    """Agents in a namespace of their own, with a secret of their own (the session's stay as
    they are)."""
    own = settings.model_copy(
        update={
            "namespace": f"secret-{uuid.uuid4().hex[:8]}",
            "state_dir": tmp_path / "state",
            "secret_file": tmp_path / "state" / "cluster.secret",
        }
    )
    return Deployment(own)


async def _plans_as(endpoint: str, secret: ClusterSecret) -> None:
    credentials = TokenCredentials(TokenSigner(secret), OPERATOR, ttl_s=60)
    async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials) as client:
        await client.plans("")


async def test_up_notices_agents_holding_another_secret_and_rotate_mends_it(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    own = _own_deployment(settings, tmp_path)
    secret_path = own.settings.secret_path
    try:
        infos = own.deploy(detached=False)
        old = ClusterSecret.load(secret_path)
        assert {info.secret_id for info in infos} == {old.key_id}
        # The operator's secret is deleted: a new one would not be the running agents'. `up`
        # says so and fails, and changes nothing: no secret written, the operator's key kept.
        operator_key = own.settings.operator_key_path.read_bytes()
        secret_path.unlink()
        with pytest.raises(
            LaunchError, match=r"hold a cluster secret .* but there is none at .*nothing was"
        ):
            Deployment(own.settings).deploy(detached=False)
        assert not secret_path.exists()
        assert own.settings.operator_key_path.read_bytes() == operator_key
        # The old secret's tokens still pass: the agents were left as they were ...
        endpoint = {info.role: info.endpoint for info in own.status()}["perception"]
        await _plans_as(endpoint, old)
        # ... and `up --replace`, which gives the agents a new secret, succeeds and writes it.
        # (This process owns those agents through `fresh`: it is kept, and rotated below.)
        fresh = Deployment(own.settings)
        replaced = fresh.deploy(detached=False, replace=True)
        new_here = ClusterSecret.load(secret_path)
        assert new_here.key_id != old.key_id
        assert {info.secret_id for info in replaced} == {new_here.key_id}
        assert IdentityKey.load(own.settings.operator_key_path).key_id == new_here.key_id
        # Rotate makes a new secret again and redeploys the agents with it.
        key_id, rotated = rotate_secret(fresh)
        assert {info.secret_id for info in rotated} == {key_id}
        current = ClusterSecret.load(secret_path)
        assert current.key_id == key_id != new_here.key_id
        endpoint = {info.role: info.endpoint for info in rotated}["perception"]
        with pytest.raises(UnauthenticatedError):
            await _plans_as(endpoint, old)
        await _plans_as(endpoint, current)
        # The operator's own key was rewritten with the new secret, and its tokens pass.
        operator = IdentityKey.load(own.settings.operator_key_path)
        assert (operator.identity, operator.key_id) == (OPERATOR, key_id)
        credentials = TokenCredentials(TokenSigner(operator), OPERATOR, ttl_s=60)
        async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials) as client:
            await client.plans("")
        # Running `up` again now finds agents and operator agreeing.
        again = Deployment(own.settings).deploy(detached=False)
        assert {info.secret_id for info in again} == {key_id}
    finally:
        own.teardown()


def test_agents_put_on_a_deployment_of_another_make_no_secret(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    # Agents put on a recorded or named Ray (not one of this process's own) must use the
    # deployment's secret, and a missing one is an error that makes none.
    own = _own_deployment(settings, tmp_path)
    with pytest.raises(MissingSecretError, match="no cluster secret at"):
        own.deploy(detached=False, create_secret=False)
    assert not own.settings.secret_path.exists()


async def test_rotate_resumes_nothing_the_old_agents_were_running(
    deployment: Deployment, settings: Settings, tmp_path: Path
) -> None:
    own = _own_deployment(settings, tmp_path)
    try:
        own.deploy(detached=False)
        # A plan the strategic agent was running, its caller still within its deadline: after a
        # restart it would be resumed. Written as the agent's journal has it.
        plan = Plan(
            id="left-running",
            owner="strategic",
            goal="find the protagonist",
            deadline=time.time() + 3600,
            steps=[
                ToolStep(
                    id="protagonist",
                    tool="find_protagonist",
                    input={"text": "Mira wants the silver crown.", "entities": []},
                )
            ],
        )
        store = await open_state_store(own.settings, "strategic")
        try:
            await store.save_plan(plan)
            await store.commit([PlanStatusRecord(plan.id, 1, PlanStatus.RUNNING)])
        finally:
            await store.aclose()
        _, rotated = rotate_secret(own)
        endpoint = {info.role: info.endpoint for info in rotated}["strategic"]
        secret = ClusterSecret.load(own.settings.secret_path)
        credentials = TokenCredentials(TokenSigner(secret), OPERATOR, ttl_s=60)
        async with AgentClient(endpoint, caller=OPERATOR, credentials=credentials) as client:
            for _ in range(200):  # the new agent cancels it in the background as it starts
                (snapshot,) = await client.plans("left-running")
                if snapshot.status != "running":
                    break
                await asyncio.sleep(0.05)
        # Cancelled, not resumed: its step never ran.
        assert snapshot.status == "cancelled"
        assert '"status":"succeeded"' not in snapshot.plan_json.replace(" ", "")
    finally:
        own.teardown()
