"""Memory on a real deployment (real Ray, real gRPC, real SQLite): an agent's plan uses the
``memory.*`` tools a policy file grants it, the outputs show in ``plans show``, the calls in the
trace, the writes in the audit log, the operator's client reads what the agent wrote, and after a
SIGKILL of the agent its restart still has the tools and the memory."""

from __future__ import annotations

import asyncio
import time
import uuid
from importlib import resources
from pathlib import Path

import pytest

from stratagem.protocol import PermissionDeniedError, SqliteAuditLog
from stratagem.runtime import Deployment, MemoryClient, Operator, read_spans
from tests.integration._agents import extension_deployment, kill_and_wait, pid_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _plan(plan_id: str, steps: list[dict[str, object]]) -> dict[str, object]:
    return {"id": plan_id, "owner": "strategic", "goal": "remember a theme", "steps": steps}


def _policy(tmp_path: Path) -> Path:
    shipped = resources.files("stratagem.protocol").joinpath("default_policy.toml")
    path = tmp_path / "policy.toml"
    path.write_text(
        shipped.read_text("utf-8")
        + '\n[[memory]]\ncaller = "*"\nnamespaces = ["agent/{caller}"]\n'
        + 'access = ["read", "write"]\n'
    )
    return path


async def test_an_agents_plan_puts_and_recalls_memory_shown_traced_and_audited(
    deployment: Deployment, tmp_path: Path
) -> None:
    # `deployment`: the session's Ray, which the agents below run on (with a policy file that
    # grants each agent its own namespace; the shipped one gives agents none).
    state = tmp_path / "state"
    with extension_deployment(
        state,
        "stratagem-memory",
        "tests.integration.ledger_extension",
        policy_file=_policy(tmp_path),
        trace_file=state / "spans.jsonl",
    ) as dep:
        await _the_memory_tools_work(dep)


async def _the_memory_tools_work(dep: Deployment) -> None:
    settings = dep.settings
    plan_id = f"memory-{uuid.uuid4().hex[:8]}"
    plan = _plan(
        plan_id,
        [
            {
                "kind": "tool",
                "id": "keep",
                "tool": "memory.put",
                "input": {
                    "namespace": "agent/strategic",
                    "key": plan_id,
                    "value": {"text": "a lighthouse keeper's loyalty", "status": "open"},
                },
            },
            {
                "kind": "tool",
                "id": "recall",
                "tool": "memory.search",
                "depends_on": ["keep"],
                "input": {
                    "namespace": "agent/strategic",
                    "query": "lighthouse loyalty",
                    "filter": {"status": "open"},
                },
            },
        ],
    )
    async with Operator(settings=settings) as op:
        ran = await op.run_plan(plan, timeout=60)
        assert ran.status == "succeeded"
        shown = await op.plan(plan_id)  # what `stratagem plans show` prints
        steps = {step.id: step for step in shown.plans[0].steps}
        assert steps["keep"].output is not None
        assert steps["keep"].output["key"] == plan_id
        recalled = steps["recall"].output["items"]  # type: ignore[index]
        assert plan_id in [item["key"] for item in recalled]
        # A namespace the shipped policy does not give the strategic agent: refused, not written.
        with pytest.raises(
            PermissionDeniedError, match=r"may not write memory namespace 'user/ana'"
        ):
            await op.run_plan(
                _plan(
                    f"{plan_id}-denied",
                    [
                        {
                            "kind": "tool",
                            "id": "steal",
                            "tool": "memory.put",
                            "input": {"namespace": "user/ana", "key": "k", "value": 1},
                        }
                    ],
                ),
                timeout=60,
            )
    # The operator's client (and so `stratagem memory`) reads what the agent wrote.
    async with MemoryClient(settings=settings) as memory:
        item = await memory.get("agent/strategic", plan_id)
        assert item is not None
        assert item.value["status"] == "open"
        assert await memory.list("user/ana") == []
    # The writes and the refusal are in the deployment's audit log, by the agent.
    log = SqliteAuditLog(settings.audit_path)
    try:
        memory_records = [
            (r.actor, r.action, r.target) for r in log.records() if r.action.startswith("memory.")
        ]
    finally:
        log.close()
    assert ("strategic", "memory.put", "agent/strategic") in memory_records
    assert ("strategic", "memory.denied", "user/ana") in memory_records
    # The agent's process killed: its restart has the tools again and reads the same memory.
    pid, _ = pid_endpoint(dep, "strategic")
    await asyncio.to_thread(kill_and_wait, dep, pid, "strategic")
    async with Operator(settings=settings) as op:
        again = await op.run_plan(
            _plan(
                f"{plan_id}-again",
                [
                    {
                        "kind": "tool",
                        "id": "read",
                        "tool": "memory.get",
                        "input": {"namespace": "agent/strategic", "key": plan_id},
                    }
                ],
            ),
            timeout=60,
        )
        assert again.status == "succeeded"
        shown = await op.plan(f"{plan_id}-again")
        [read] = shown.plans[0].steps
        assert read.output is not None
        assert read.output["found"] is True
        assert read.output["item"]["value"]["text"] == "a lighthouse keeper's loyalty"
    # The tool spans carry the namespace, the key and the hits (the trace of `stratagem trace`).
    assert settings.trace_file is not None
    deadline = time.monotonic() + 90  # batched exports, a loaded machine
    while time.monotonic() < deadline:
        spans = [
            s
            for s in read_spans(settings.trace_file, ran.trace_id)
            if "stratagem.memory.namespace" in s.attributes
        ]
        if len(spans) >= 2:
            break
        await asyncio.sleep(0.5)
    assert plan_id in [s.attributes.get("stratagem.memory.key") for s in spans], spans
    assert any(s.attributes.get("stratagem.memory.hits", 0) >= 1 for s in spans), spans
    assert {s.attributes["stratagem.memory.namespace"] for s in spans} == {"agent/strategic"}
