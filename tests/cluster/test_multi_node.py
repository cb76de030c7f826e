"""Stratagem on a Ray cluster of three nodes: placement, cross-node gRPC, the CLI, a node failure.

The cluster (``conftest.py``) is a head and workers ``a`` and ``b`` on this machine. The last test
kills a worker node, so it runs last and the cluster has two nodes afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from stratagem.planning import PostgresStateStore
from stratagem.protocol import AgentClient, ClientConfig, RemoteError
from stratagem.runtime import read_spans
from tests.cluster._nodes import RayNodes
from tests.cluster.conftest import REPO, Stratagem, stratagem_on
from tests.conftest import fresh_database
from tests.integration._ledger import drive, ledger_lines, ledger_plan

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(900)]

ON_HEAD = {"labels": {"stratagem/node": "head"}}


def _agents(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {agent["role"]: agent for agent in status["agents"]}


def _ray_script(address: str, namespace: str, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a Python process connected to the cluster (``ray`` and ``ns`` defined)."""
    script = (
        "import ray\n"
        f"ray.init(address={address!r}, namespace={namespace!r}, log_to_driver=False)\n"
        f"ns = {namespace!r}\n" + body
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )


def test_agents_placed_on_three_nodes_serve_a_goal_and_the_cli_manages_them(
    ray_nodes: RayNodes, tmp_path: Path
) -> None:
    deployment = stratagem_on(
        ray_nodes,
        tmp_path / "state",
        "stratagem-cli",
        placement={
            "strategic": ON_HEAD,
            "perception": {"labels": {"stratagem/node": "a"}},
            "tactical": {"resources": {"stratagem-b": 0.01}},
        },
    )
    first = _agents(deployment.json("up"))
    assert {role: a["node_labels"]["stratagem/node"] for role, a in first.items()} == {
        "strategic": "head",
        "perception": "a",
        "tactical": "b",
        "orchestrator": first["orchestrator"]["node_labels"]["stratagem/node"],
    }
    assert len({first[r]["node_id"] for r in ("strategic", "perception", "tactical")}) == 3
    assert all(a["health"] == "serving" and a["restarts"] == 0 for a in first.values())

    # `up` again changes nothing: the same processes on the same endpoints.
    repeated = deployment.json("up")
    again = _agents(repeated)
    assert {r: (a["pid"], a["endpoint"]) for r, a in again.items()} == {
        r: (a["pid"], a["endpoint"]) for r, a in first.items()
    }
    assert repeated["stale"] == []
    # With other settings it still changes nothing, but says which agents run the old ones.
    deployment.env["STRATAGEM_MAX_IN_FLIGHT"] = "8"
    changed = deployment.json("up")
    assert sorted(changed["stale"]) == sorted(first)
    assert {a["pid"] for a in changed["agents"]} == {a["pid"] for a in first.values()}

    # A goal through all four agents: gRPC between processes on different nodes.
    outcome = deployment.json("submit", "examples/orchard.yaml", timeout=300)
    assert outcome["plans"], outcome
    assert outcome["audit"]["ok"], outcome["audit"]
    assert {f"stratagem-{role}" for role in first} <= set(outcome["services"])
    assert _cross_node_hops(deployment, outcome["trace_id"], first) >= 1

    status = deployment.json("status")
    assert all(a["health"] == "serving" for a in status["agents"])
    assert status["mode"] == "cluster"
    # The same deployment through the Ray client (ray://), as from outside the cluster.
    remote = deployment.json("status", address=ray_nodes.client_address)
    assert {a["role"]: a["pid"] for a in remote["agents"]} == {
        r: a["pid"] for r, a in first.items()
    }

    # A bystander in the same namespace: `down` must leave it alone.
    made = _ray_script(
        deployment.address,
        "stratagem-cli",
        "@ray.remote(num_cpus=0)\n"
        "class Bystander:\n    def ping(self): return 'pong'\n"
        "Bystander.options(name='bystander', lifetime='detached').remote()\n"
        "print(ray.get(ray.get_actor('bystander').ping.remote()))\n",
    )
    assert "pong" in made.stdout.splitlines(), (made.stdout[-1000:], made.stderr[-2000:])

    replaced_out = deployment.json("up", "--replace")
    replaced = _agents(replaced_out)
    assert all(replaced[r]["pid"] != first[r]["pid"] for r in first)
    assert replaced_out["stale"] == []

    removed = deployment.json("down")
    assert sorted(removed["removed"]) == sorted(first)
    gone = deployment.run("status")
    assert gone.returncode == 1, gone.stderr
    assert "agents not deployed" in gone.stderr, gone.stderr
    left = _ray_script(
        deployment.address,
        "stratagem-cli",
        "print(ray.get(ray.get_actor('bystander').ping.remote()))\n"
        "ray.kill(ray.get_actor('bystander'))\n",
    )
    assert "pong" in left.stdout.splitlines(), (left.stdout[-1000:], left.stderr[-2000:])


def test_an_agent_no_node_can_host_is_named_by_up_and_status(
    ray_nodes: RayNodes, tmp_path: Path
) -> None:
    deployment = stratagem_on(
        ray_nodes,
        tmp_path / "state",
        "stratagem-nowhere",
        placement={"perception": {"labels": {"stratagem/node": "nowhere"}}},
        # Long enough for the agents a node can host to start on a loaded machine (with 5 s,
        # a busy CI machine also named agents that were merely slow).
        deploy_timeout_s="30",
    )
    up = deployment.run("up")
    assert up.returncode == 1, up.stderr
    assert "did not start within 30s: perception" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr
    status = deployment.json("status", expect=1)
    health = {a["role"]: (a["health"], a["state"]) for a in status["agents"]}
    assert health.pop("perception") == ("not answering", "PENDING_CREATION"), health
    assert set(health.values()) == {("serving", "ALIVE")}, health
    assert sorted(deployment.json("down")["removed"]) == sorted(
        ["strategic", "tactical", "perception", "orchestrator"]
    )


def test_a_goal_submitted_as_a_ray_job_runs_on_the_deployment(
    ray_nodes: RayNodes, tmp_path: Path
) -> None:
    """``ray job submit --working-dir . -- stratagem submit GOAL``, as deploy/README.md shows: the
    CLI runs as the job's driver on the head and finds the agents through the job's Ray."""
    deployment = stratagem_on(
        ray_nodes,
        tmp_path / "state",
        "stratagem-jobs",
        placement={"perception": {"labels": {"stratagem/node": "a"}}},
    )
    deployment.json("up")
    # The deployment's settings go with the job (on a real head they are in its environment).
    settings = {k: v for k, v in deployment.env.items() if k.startswith("STRATAGEM_")}
    job = subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "job",
            "submit",
            f"--address={ray_nodes.dashboard_url}",
            "--working-dir=.",
            f"--runtime-env-json={json.dumps({'env_vars': settings})}",
            "--",
            "stratagem",
            "submit",
            "examples/orchard.yaml",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
        env=deployment.environment(),
    )
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    outcome = _json_in(job.stdout)
    assert outcome["response"]["status"] == "succeeded", outcome["response"]
    assert outcome["audit"]["ok"], outcome["audit"]
    assert re.search(r"Job 'raysubmit_\w+' succeeded", job.stdout), job.stdout[-500:]
    assert deployment.json("down")["removed"]


def _json_in(text: str) -> dict[str, Any]:
    """The one JSON object a job printed between Ray's own log lines."""
    lines = text.splitlines()
    start = lines.index("{")
    end = start + lines[start:].index("}")
    parsed: dict[str, Any] = json.loads("\n".join(lines[start : end + 1]))
    return parsed


def _cross_node_hops(deployment: Stratagem, trace_id: str, agents: dict[str, Any]) -> int:
    """Client spans whose server span ran in an agent on another node (from the span file)."""
    node_of_pid = {a["pid"]: a["node_id"] for a in agents.values()}
    spans = read_spans(deployment.state_dir / "spans.jsonl", trace_id)
    by_id = {s.span_id: s for s in spans}
    hops = 0
    for server in (s for s in spans if s.kind == "SERVER"):
        client = by_id.get(server.parent_id)
        if client is None or client.kind != "CLIENT":
            continue
        nodes = {node_of_pid.get(client.pid), node_of_pid.get(server.pid)}
        if None not in nodes and len(nodes) == 2:
            hops += 1
    return hops


@pytest.fixture
def failover_db(postgres_server: str) -> Iterator[str]:
    """A fresh database, as the ``postgresql://`` URL ``STRATAGEM_STORE_URL`` takes."""
    with fresh_database(postgres_server) as conninfo:
        parts = conninfo_to_dict(conninfo)
        yield f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


PLANS = 4
STEPS = 24
WIDTH = 4


async def test_a_worker_node_dies_and_its_agent_finishes_every_plan_elsewhere_exactly_once(
    ray_nodes: RayNodes, tmp_path: Path, failover_db: str
) -> None:
    deployment = stratagem_on(
        ray_nodes,
        tmp_path / "state",
        "stratagem-failover",
        store_url=failover_db,
        placement={
            "strategic": ON_HEAD,
            "perception": ON_HEAD,
            "orchestrator": ON_HEAD,
            "tactical": {"resources": {"stratagem-worker": 0.01}},
        },
        extensions="tests.integration.ledger_extension",
        extension_paths=str(REPO),
        max_restarts="-1",
    )
    before = _agents(await asyncio.to_thread(deployment.json, "up"))["tactical"]
    victim = before["node_labels"]["stratagem/node"]
    survivor = {"a": "b", "b": "a"}[victim]
    ledger = tmp_path / "ledger.txt"
    creds = deployment.credentials()
    plan_ids = [f"failover-{i}" for i in range(PLANS)]

    async with AgentClient(
        before["endpoint"], credentials=creds, config=ClientConfig(default_timeout_s=120)
    ) as client:
        runs = [
            asyncio.create_task(
                client.run_plan(
                    ledger_plan(plan_id, ledger, steps=STEPS, width=WIDTH, pause_s=0.05),
                    request_id=plan_id,
                )
            )
            for plan_id in plan_ids
        ]
        # Kill the node once a third of the effects happened: every plan is mid-way.
        while sum(ledger_lines(ledger).values()) < PLANS * STEPS // 3:
            assert not any(run.done() for run in runs), [r.result() for r in runs if r.done()]
            await asyncio.sleep(0.005)
        killed_at = time.monotonic()
        await asyncio.to_thread(ray_nodes.kill, victim)
        for run in runs:
            with contextlib.suppress(RemoteError):
                await run  # UNAVAILABLE: the agent's node died under the call

    polls: list[tuple[int, str, str]] = []
    after = await asyncio.to_thread(_serving_elsewhere, deployment, before["node_id"], polls)
    back_in = time.monotonic() - killed_at
    assert after["node_labels"]["stratagem/node"] == survivor
    assert after["restarts"] >= 1
    # Whenever a poll found it not serving, `status` still answered and exited 1.
    assert all(code == 1 for code, health, _ in polls if health != "serving"), polls

    gates: dict[str, set[str]] = {plan_id: set() for plan_id in plan_ids}
    statuses = {}
    for plan_id in plan_ids:
        status = await drive(after["endpoint"], plan_id, ledger, gates[plan_id], creds)
        statuses[plan_id] = status or await _stored_status(failover_db, plan_id)
    assert statuses == dict.fromkeys(plan_ids, "succeeded")

    counts = ledger_lines(ledger)
    for plan_id in plan_ids:
        for i in range(STEPS):
            assert counts[f"{plan_id} s{i}"] == 1, (plan_id, i, counts[f"{plan_id} s{i}"])
    assert sum(counts.values()) == PLANS * STEPS

    verified = await asyncio.to_thread(deployment.run, "audit", "verify", on_ray=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # An operator on another node: a state dir holding only the audit key. The seals the agents
    # made on every node are in the store beside the log, so all of them are checked there too.
    elsewhere = tmp_path / "another-node"
    elsewhere.mkdir()
    shutil.copy2(tmp_path / "state" / "audit.key", elsewhere / "audit.key")
    there = await asyncio.to_thread(
        deployment.run, "audit", "verify", "--state-dir", str(elsewhere), "--json", on_ray=False
    )
    assert there.returncode == 0, there.stdout + there.stderr
    assert json.loads(there.stdout)["signed_heads"] >= 1
    assert not (elsewhere / "audit.heads").exists()
    down = await asyncio.to_thread(deployment.json, "down")
    assert len(down["removed"]) == 4
    print(
        f"node {victim} killed; tactical serving again on node {survivor} after {back_in:.1f}s; "
        f"{sum(len(g) for g in gates.values())} reconcile gates decided; status polls: {polls}"
    )


def _serving_elsewhere(
    deployment: Stratagem, dead_node: str, seen: list[tuple[int, str, str]]
) -> dict[str, Any]:
    """Poll ``stratagem status`` until the tactical agent serves on another node; ``seen`` gets
    (exit code, health, Ray state) of each poll."""
    deadline = time.monotonic() + 180
    last: Any = None
    while time.monotonic() < deadline:
        done = deployment.run("status", "--json", timeout=120)
        if done.stdout.strip():
            last = _agents(json.loads(done.stdout))["tactical"]
            seen.append((done.returncode, last["health"], last["state"]))
            if last["health"] == "serving" and last["node_id"] != dead_node:
                return dict(last)
        time.sleep(1)
    raise AssertionError(f"the tactical agent did not come back on another node: {last}")


async def _stored_status(url: str, plan_id: str) -> str:
    async with PostgresStateStore(url, schema="stratagem_tactical") as store:
        state = await store.load(plan_id)
    assert state is not None, plan_id
    return state.status.value
