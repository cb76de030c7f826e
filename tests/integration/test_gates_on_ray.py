"""Gates on real Ray and gRPC: a deadline that fires once across a SIGKILL of its owner, who may
decide (a deny audited), escalation told to a real webhook, per-tool approval with edited
arguments, and a fork whose effects happen once each.

A deployment of its own (namespace ``stratagem-gates``, its own state directory) runs the four
agents with ``tests.integration.ledger_extension`` (the tactical agent's ``ledger_append``
appends ``"<plan id> <step id>"`` to a ledger file per execution: the effects' system of record),
a policy of its own (roles, a gate rule, a tool approval; ``ana`` and ``bo`` may decide), and
``STRATAGEM_GATE_WEBHOOK_URL`` pointing at an HTTP server in this process, which checks each
delivery's signature with the deployment's key. It shares the session's Ray with the other
modules but none of their actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import TIMEOUT_APPROVER, GateDecision, GateRecord, SqliteStateStore
from stratagem.protocol import (
    CAPABILITIES,
    AgentClient,
    PermissionDeniedError,
    RemoteError,
    SqliteAuditLog,
    register_capability,
)
from stratagem.runtime import Deployment
from tests.integration._agents import (
    assert_audit_ok,
    extension_deployment,
    file_lines,
    kill_and_wait,
    pid_endpoint,
)
from tests.integration._auth import credentials
from tests.integration._ledger import FINAL, next_stop, plan_snapshot
from tests.integration.ledger_extension import RECORD_ENTRY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POLICY = """
[[allow]]
caller = "ana"
target = "tactical"
capabilities = ["Control.approve", "Control.reject", "Plans", "Watch"]

[[allow]]
caller = "bo"
target = "tactical"
capabilities = ["Control.approve", "Control.reject", "Plans", "Watch"]

[roles]
leads = ["ana"]

[[approval]]
agent = "tactical"
tool = "ledger_append"
when = "arguments.pause_s > `1`"
deciders = ["role:leads"]
"""


class Hooks(http.server.ThreadingHTTPServer):
    """A webhook receiver on 127.0.0.1: every delivery, its headers and body."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Hook)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/gates"

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body in self.got]


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert isinstance(self.server, Hooks)
        with self.server.lock:
            self.server.got.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def hooks() -> Iterator[Hooks]:
    server = Hooks()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def gated(
    deployment: Deployment, tmp_path_factory: pytest.TempPathFactory, hooks: Hooks
) -> Iterator[Deployment]:
    """The four agents with the ledger extension, a policy of gates and the webhook."""
    state = tmp_path_factory.mktemp("gates-state")
    shipped = resources.files("stratagem.protocol").joinpath("default_policy.toml").read_text()
    policy = state / "policy.toml"
    policy.write_text(shipped + POLICY)
    register_capability(RECORD_ENTRY)
    try:
        with extension_deployment(
            state,
            "stratagem-gates",
            "tests.integration.ledger_extension",
            policy_file=policy,
            gate_webhook_url=hooks.url,
            gate_webhook_allowed_networks=["127.0.0.1/32"],
        ) as ours:
            yield ours
    finally:
        CAPABILITIES.pop(RECORD_ENTRY.name, None)


def _plan(plan_id: str, steps: list[dict[str, Any]]) -> str:
    return json.dumps({"id": plan_id, "owner": "tactical", "goal": "gates", "steps": steps})


def _write(step_id: str, ledger: Path, *deps: str, pause_s: float = 0.0) -> dict[str, Any]:
    return {
        "kind": "tool",
        "id": step_id,
        "tool": "ledger_append",
        "input": {"ledger": str(ledger), "pause_s": pause_s},
        "depends_on": list(deps),
    }


async def _stop(endpoint: str, plan_id: str, identity: str = "operator") -> str:
    """The plan's next plan-level blocked or final status."""
    async with AgentClient(endpoint, credentials=credentials(identity)) as client:
        await next_stop(client, plan_id)
        snapshot = await plan_snapshot(client, plan_id)
    assert snapshot is not None
    return snapshot.status


async def _finished(endpoint: str, plan_id: str) -> str:
    for _ in range(600):
        status = await _stop(endpoint, plan_id)
        if status in FINAL:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"plan {plan_id} did not finish")


def _verify(hooks: Hooks, key: bytes) -> None:
    with hooks.lock:
        got = list(hooks.got)
    for headers, body in got:
        stamp = headers["X-Stratagem-Timestamp"]
        digest = hmac.new(key, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert headers["X-Stratagem-Signature"] == f"v1={digest}"


def _events(hooks: Hooks, plan_id: str) -> dict[str, str]:
    """Delivery key -> event type, for one plan (a key delivered twice counts once)."""
    return {b["key"]: b["type"] for b in hooks.bodies() if b["plan_id"] == plan_id}


async def _journal_gates(dep: Deployment, plan_id: str) -> list[GateRecord]:
    async with SqliteStateStore(dep.settings.plans_path("tactical")) as store:
        return [r for r in await store.journal(plan_id) if isinstance(r, GateRecord)]


def _audit(dep: Deployment) -> list[Any]:
    log = SqliteAuditLog(dep.settings.audit_path)
    try:
        return list(log.records())
    finally:
        log.close()


async def test_a_gate_timeout_fires_once_across_a_kill_of_its_owner(
    gated: Deployment, hooks: Hooks
) -> None:
    ledger = gated.settings.state_dir / "timeout.ledger"
    plan_id = "gate-timeout-kill"
    steps = [
        {"kind": "gate", "id": "ok", "prompt": "Write?", "timeout_s": 3, "on_timeout": "approve"},
        _write("write", ledger, "ok"),
    ]
    pid, endpoint = pid_endpoint(gated)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        run = asyncio.create_task(client.run_plan(_plan(plan_id, steps), timeout=60))
        await next_stop(client, plan_id)  # blocked at the gate: its deadline is journaled
        endpoint = await asyncio.to_thread(kill_and_wait, gated, pid)
        with contextlib.suppress(RemoteError):
            await run
    assert await _finished(endpoint, plan_id) == "succeeded"
    assert file_lines(ledger) == [f"{plan_id} write"]  # the gate opened the way once
    decisions = [
        r for r in await _journal_gates(gated, plan_id) if r.decision is not GateDecision.OPEN
    ]
    assert [(r.decision, r.approver) for r in decisions] == [
        (GateDecision.APPROVED, TIMEOUT_APPROVER)
    ]
    async with AgentClient(endpoint, credentials=credentials()) as client:
        snapshot = await plan_snapshot(client, plan_id)
        events = [e async for e in client.watch(plan_id, timeout=30)]
    assert snapshot is not None
    [gate] = [g for g in snapshot.gates if g.gate_id == "ok"]
    assert (gate.event, gate.decision, gate.approver) == ("timed_out", "approved", "(timeout)")
    assert any(e.gate is not None and e.gate.event == "timed_out" for e in events)
    audited = [r for r in _audit(gated) if r.action == "gate.timed_out" and plan_id in r.detail]
    assert len(audited) == 1
    for _ in range(300):  # the webhook is told of the opening and of the timeout, once each
        if sorted(_events(hooks, plan_id).values()) == ["gate.opened", "gate.timed_out"]:
            break
        await asyncio.sleep(0.1)
    assert sorted(_events(hooks, plan_id).values()) == ["gate.opened", "gate.timed_out"]
    _verify(hooks, gated.settings.gate_webhook_key_path.read_bytes())
    assert_audit_ok(gated)


async def test_a_deny_for_an_identity_the_gate_does_not_name_and_an_escalation(
    gated: Deployment, hooks: Hooks
) -> None:
    ledger = gated.settings.state_dir / "deny.ledger"
    plan_id = "gate-deciders"
    steps = [
        {
            "kind": "gate",
            "id": "ok",
            "prompt": "Write?",
            "deciders": ["ana"],
            "escalate_after_s": 1,
            "escalate_to": ["bo"],
        },
        _write("write", ledger, "ok"),
    ]
    _, endpoint = pid_endpoint(gated)
    # The operator's client stays open while the plan runs: its RunPlan call carries the run.
    operator = AgentClient(endpoint, credentials=credentials())
    run = asyncio.create_task(operator.run_plan(_plan(plan_id, steps), timeout=60))
    await next_stop(operator, plan_id)
    async with AgentClient(endpoint, credentials=credentials("bo")) as bo:
        with pytest.raises(PermissionDeniedError, match="'bo' may not decide gate 'ok'"):
            await bo.control(plan_id, "approve", gate_id="ok", rationale="mine now?")
    for _ in range(300):  # undecided for a second: it passes to bo, and the webhook hears of it
        if "gate.escalated" in _events(hooks, plan_id).values():
            break
        await asyncio.sleep(0.1)
    [escalated] = [
        b for b in hooks.bodies() if b["type"] == "gate.escalated" and b["plan_id"] == plan_id
    ]
    assert escalated["gate"]["deciders"] == ["bo"]
    async with AgentClient(endpoint, credentials=credentials("ana")) as ana:
        with pytest.raises(PermissionDeniedError, match="'ana' may not decide"):
            await ana.control(plan_id, "approve", gate_id="ok", rationale="too late")
    async with AgentClient(endpoint, credentials=credentials("bo")) as bo:
        await bo.control(plan_id, "approve", gate_id="ok", rationale="handed to me")
    try:
        assert (await run).status == "succeeded"
    finally:
        await operator.aclose()
    assert file_lines(ledger) == [f"{plan_id} write"]
    denied = [
        r
        for r in _audit(gated)
        if r.capability == "Control.approve" and r.code == "PERMISSION_DENIED"
    ]
    assert {r.actor for r in denied} >= {"bo", "ana"}
    assert_audit_ok(gated)


async def test_per_tool_approval_with_edited_arguments_runs_the_tool_once_with_them(
    gated: Deployment,
) -> None:
    ledger = gated.settings.state_dir / "approval.ledger"
    edited = gated.settings.state_dir / "approval-edited.ledger"
    plan_id = "tool-approval"
    steps = [_write("quick", ledger), _write("slow", ledger, "quick", pause_s=5)]
    _, endpoint = pid_endpoint(gated)
    operator = AgentClient(endpoint, credentials=credentials())
    run = asyncio.create_task(operator.run_plan(_plan(plan_id, steps), timeout=60))
    await next_stop(operator, plan_id)
    snapshot = await plan_snapshot(operator, plan_id)
    assert snapshot is not None
    [gate] = snapshot.gates
    assert (gate.kind, gate.tool, gate.deciders) == ("tool", "ledger_append", ["role:leads"])
    assert json.loads(gate.arguments_json)["pause_s"] == 5
    async with AgentClient(endpoint, credentials=credentials("ana")) as ana:
        await ana.control(
            plan_id,
            "approve",
            gate_id="slow",
            rationale="no need to wait, other ledger",
            arguments={"ledger": str(edited), "pause_s": 0},
        )
    try:
        assert (await run).status == "succeeded"
    finally:
        await operator.aclose()
    assert file_lines(ledger) == [f"{plan_id} quick"]
    assert file_lines(edited) == [f"{plan_id} slow"]  # once, with the edited input
    async with AgentClient(endpoint, credentials=credentials()) as client:
        history = await client.revisions(plan_id)
    assert (history.revisions[-1].revision, history.revisions[-1].author) == (2, "ana")


async def test_a_fork_with_a_substituted_output_reruns_only_what_follows(
    gated: Deployment,
) -> None:
    ledger = gated.settings.state_dir / "fork.ledger"
    plan_id = "fork-source"
    steps = [_write("a", ledger), _write("b", ledger, "a"), _write("c", ledger, "b")]
    _, endpoint = pid_endpoint(gated)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        done = await client.run_plan(_plan(plan_id, steps), timeout=60)
        assert done.status == "succeeded"
        fork = await client.fork(
            plan_id,
            at_step="c",
            outputs={"b": {"line": "substituted"}},
            new_plan_id="fork-child",
            rationale="what if b had said otherwise",
        )
        assert fork.plan_id == "fork-child"
    assert await _finished(endpoint, "fork-child") == "succeeded"
    lines = file_lines(ledger)
    assert sorted(lines) == sorted([f"{plan_id} a", f"{plan_id} b", f"{plan_id} c", "fork-child c"])
    async with AgentClient(endpoint, credentials=credentials()) as client:
        report = await client.replay("fork-child")
        child = await plan_snapshot(client, "fork-child")
    assert report.divergences == []
    assert child is not None
    lineage = json.loads(child.plan_json)["forked_from"]
    assert (lineage["plan_id"], lineage["at_step"], lineage["carried"]) == (
        plan_id,
        "c",
        ["a", "b"],
    )
