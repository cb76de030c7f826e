"""Artifacts in a deployment on real Ray and gRPC: the tools the policy grants, a plan saving and
loading an artifact with its provenance, a large output journaled by reference (the claim check),
and ``stratagem artifacts`` reading what the agents saved.

A deployment of its own (namespace ``stratagem-artifacts``, its own state directory and policy:
the shipped one plus a rule granting the tactical agent ``artifact.save/load/list``) shares the
session's Ray with the other modules but none of their actors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stratagem.planning import ArtifactRef
from stratagem.runtime import ArtifactsClient, Deployment, Operator, load_settings
from stratagem.runtime._cli import app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GRANT = """
[[allow]]
caller = "tactical"
target = "artifact"
capabilities = ["save", "load", "list"]
"""
BIG = "y" * (1200 * 1024)  # more than the claim check's 1 MiB once returned by artifact.load


@pytest.fixture(scope="module")
def ours(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    state = tmp_path_factory.mktemp("artifacts-state")
    shipped = resources.files("stratagem.protocol").joinpath("default_policy.toml").read_text()
    policy = state / "policy.toml"
    policy.write_text(shipped + GRANT)
    dep = Deployment(
        load_settings(
            state_dir=state,
            namespace="stratagem-artifacts",
            grpc_host="127.0.0.1",
            default_deadline_s=60.0,
            request_timeout_s=60.0,
            max_message_bytes=4 * 1024 * 1024,  # a plan carrying 1.2 MiB of text
            policy_file=policy,
        )
    )
    dep.deploy(detached=False)
    try:
        yield dep
    finally:
        dep.teardown()


def _run(dep: Deployment, plan: dict[str, Any]) -> Any:
    import asyncio

    async def go() -> Any:
        async with Operator(settings=dep.settings) as op:
            view = await op.run_plan(plan)
            return view, await op.plan(plan["id"], full=True)

    return asyncio.run(go())


def test_a_granted_agent_saves_and_loads_with_provenance_and_a_claim_check(
    ours: Deployment, tmp_path: Path
) -> None:
    plan = {
        "id": "art-1",
        "owner": "tactical",
        "goal": "save and read back",
        "steps": [
            {
                "kind": "tool",
                "id": "save",
                "tool": "artifact.save",
                "input": {"name": "notes.txt", "text": BIG},
            },
            {
                "kind": "tool",
                "id": "load",
                "tool": "artifact.load",
                "input": {"name": "notes.txt"},
                "depends_on": ["save"],
            },
            {
                "kind": "tool",
                "id": "list",
                "tool": "artifact.list",
                "input": {},
                "depends_on": ["load"],
            },
        ],
    }
    view, history = _run(ours, plan)
    assert view.status == "succeeded", view
    client = ArtifactsClient(ours.settings)
    saved = client.show_blocking("notes.txt", scope="plan", scope_id="art-1")
    assert saved.size == len(BIG)
    assert (saved.provenance.agent, saved.provenance.step_id) == ("tactical", "save")
    assert client.get_blocking("notes.txt", scope="plan", scope_id="art-1")[1] == BIG.encode()
    # the load step's output (the 1.2 MiB text) went to the journal as a reference
    claimed = client.show_blocking("load.output.json", scope="plan", scope_id="art-1")
    assert claimed.provenance.tool == "claim-check"
    [load] = [s for v in history.plans for s in v.steps if s.id == "load"]
    ref = ArtifactRef.in_output(load.output)
    assert [r.name for r in ref] == ["load.output.json"]
    listed = CliRunner().invoke(
        app,
        [
            "artifacts",
            "list",
            "--plan",
            "art-1",
            "--json",
            "--state-dir",
            str(ours.settings.state_dir),
        ],
    )
    assert listed.exit_code == 0, listed.stderr
    assert sorted(a["name"] for a in json.loads(listed.stdout)) == [
        "load.output.json",
        "notes.txt",
    ]
    # The README's other two commands (README.md, "Artifacts and memory"), on this plan.
    state = ["--plan", "art-1", "--state-dir", str(ours.settings.state_dir)]
    out = tmp_path / "notes.txt"
    got = CliRunner().invoke(app, ["artifacts", "get", "notes.txt", *state, "-o", str(out)])
    assert got.exit_code == 0, got.stderr
    assert out.read_bytes() == BIG.encode()
    made = CliRunner().invoke(app, ["artifacts", "provenance", "notes.txt", *state])
    assert made.exit_code == 0, made.stderr
    assert "save" in made.stdout
    assert "tactical" in made.stdout
    client.close()
