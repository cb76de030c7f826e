"""Durable plans on real Ray: agents killed with SIGKILL mid-plan resume, exactly once.

A deployment of its own (namespace ``stratagem-durable``, its own state directory) runs the four
agents with ``tests.integration.ledger_extension`` loaded: the tactical agent has a non-idempotent
tool that appends ``"<plan id> <step id>"`` to a ledger file per execution. The tests kill the
tactical agent's process (not a polite stop), let Ray restart it, let it resume its plans from its
SQLite store, decide each reconcile gate from the ledger (the effect's system of record, as
``docs/durability.md`` prescribes: a line present means the effect happened, so approve with the
output recorded; no line means it did not, so approve a re-run), and count the ledger's lines.

It shares the session's Ray with ``test_agents_on_ray.py`` but none of its actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import SqliteStateStore
from stratagem.protocol import (
    CAPABILITIES,
    OPERATOR,
    AgentClient,
    RemoteError,
    SqliteAuditLog,
    register_capability,
)
from stratagem.runtime import Deployment
from tests.integration._agents import (
    assert_audit_ok,
    extension_deployment,
    kill_and_wait,
    pid_endpoint,
)
from tests.integration._auth import credentials
from tests.integration._ledger import (
    FINAL,
    drive,
    ledger_lines,
    ledger_plan,
    next_stop,
    plan_snapshot,
)
from tests.integration.ledger_extension import (
    RECORD_ENTRY,
    RecordEntryRequest,
    RecordEntryResponse,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STEPS = 50
WIDTH = 5  # five chains of ten steps: step i waits for step i - WIDTH
SEEDS = range(20)


@pytest.fixture(scope="module")
def record_entry() -> Iterator[None]:
    """``RecordEntry`` in this process's registry while the module runs (to encode requests)."""
    register_capability(RECORD_ENTRY)
    try:
        yield
    finally:
        # Later tests (other modules) see only the built-in capabilities again.
        CAPABILITIES.pop(RECORD_ENTRY.name, None)


@pytest.fixture(scope="module")
def durable(
    deployment: Deployment, tmp_path_factory: pytest.TempPathFactory, record_entry: None
) -> Iterator[Deployment]:
    """The four agents with the ledger extension, on the session's Ray, removed at the end."""
    with extension_deployment(
        tmp_path_factory.mktemp("durable-state"),
        "stratagem-durable",
        "tests.integration.ledger_extension",
    ) as ours:
        yield ours


def _ledger(durable: Deployment) -> Path:
    return durable.settings.state_dir / "ledger.txt"


def _wait_for_effects(ledger: Path, plan_id: str, count: int, run: asyncio.Task[Any]) -> None:
    """Block until the ledger holds ``count`` effects of ``plan_id`` (or the run ended)."""
    prefix = f"{plan_id} "
    while not run.done():
        if sum(n for line, n in ledger_lines(ledger).items() if line.startswith(prefix)) >= count:
            return
        time.sleep(0.001)


def _crash_plan(plan_id: str, ledger: Path) -> str:
    return ledger_plan(plan_id, ledger, steps=STEPS, width=WIDTH)


async def _stored_status(durable: Deployment, plan_id: str) -> str:
    async with SqliteStateStore(durable.settings.plans_path("tactical")) as store:
        state = await store.load(plan_id)
    assert state is not None, plan_id
    return state.status.value


@pytest.mark.timeout(600)  # twenty restarts of an agent's process: minutes on a busy machine
async def test_a_killed_agent_resumes_every_plan_and_runs_each_effect_once(
    durable: Deployment,
) -> None:
    ledger = _ledger(durable)
    reconciled: dict[str, set[str]] = {}
    resumed = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        plan_id = f"crash-{seed}"
        pid, endpoint = pid_endpoint(durable)
        async with AgentClient(endpoint, credentials=credentials()) as client:
            run = asyncio.create_task(
                client.run_plan(_crash_plan(plan_id, ledger), timeout=60, request_id=plan_id)
            )
            # Where the kill lands, seeded: after this many of the plan's effects, a moment later.
            effects = rng.randrange(STEPS)
            await asyncio.to_thread(_wait_for_effects, ledger, plan_id, effects, run)
            await asyncio.sleep(rng.uniform(0, 0.01))
            endpoint = await asyncio.to_thread(kill_and_wait, durable, pid)
            # The agent died under the call (UNAVAILABLE), unless the plan finished first.
            with contextlib.suppress(RemoteError):
                await run
        gates = reconciled.setdefault(plan_id, set())
        status = await drive(endpoint, plan_id, ledger, gates)
        if status is None:
            status = await _stored_status(durable, plan_id)
        else:
            resumed += 1
        assert status == "succeeded", (seed, status)

    counts = ledger_lines(ledger)
    for seed in SEEDS:
        for i in range(STEPS):
            assert counts[f"crash-{seed} s{i}"] == 1, (seed, i, counts[f"crash-{seed} s{i}"])
    # Report how many kills landed while an effect was in flight (no assertion: it is seeded luck).
    print(
        f"{len(SEEDS)} kills, {resumed} plans held by the restarted agent, "
        f"{sum(map(len, reconciled.values()))} reconcile gates decided"
    )
    assert_audit_ok(durable)


ITEMS = 30
MAP_SEEDS = range(6)


def _map_plan(plan_id: str, ledger: Path) -> str:
    """A map of ``ledger_append`` over ``ITEMS`` items, three at a time (not idempotent)."""
    return json.dumps(
        {
            "id": plan_id,
            "owner": "tactical",
            "goal": "crash me mid-map",
            "inputs": {"items": list(range(ITEMS))},
            "steps": [
                {
                    "kind": "map",
                    "id": "m",
                    "over": "inputs.items",
                    "max_items": ITEMS,
                    "max_parallel": 3,
                    "tool": "ledger_append",
                    "input": {"ledger": str(ledger), "pause_s": 0.01},
                },
                {
                    "kind": "tool",
                    "id": "after",
                    "tool": "ledger_append",
                    "input": {"ledger": str(ledger)},
                    "depends_on": ["m"],
                    "when": f"length(m.items) == `{ITEMS}`",
                },
            ],
        }
    )


async def _drive_map(endpoint: str, plan_id: str, ledger: Path, decided: set[str]) -> str | None:
    """Follow a resumed map plan to its end; the map's reconcile gate (its items in flight at the
    kill) is decided from the ledger: the items whose line is there did happen (their outputs
    given), the others run again."""
    async with AgentClient(endpoint, credentials=credentials()) as client:
        while True:
            snapshot = await plan_snapshot(client, plan_id)
            if snapshot is None or snapshot.status in FINAL:
                return None if snapshot is None else snapshot.status
            steps = json.loads(snapshot.plan_json)["steps"]
            blocked = [step["id"] for step in steps if step.get("status") == "blocked"]
            if "m" in blocked and "m" not in decided:
                decided.add("m")
                lines = ledger_lines(ledger)
                happened = {
                    str(i): {"line": f"{plan_id} m.{i}"}
                    for i in range(ITEMS)
                    if lines[f"{plan_id} m.{i}"] > 0
                }
                await client.control(
                    plan_id,
                    "approve",
                    gate_id="m",
                    rationale="the ledger says which items happened",
                    output={"items": happened},
                )
                continue
            await next_stop(client, plan_id)


async def test_a_map_killed_mid_way_resumes_and_runs_each_item_once(durable: Deployment) -> None:
    ledger = _ledger(durable)
    held = gates = 0
    for seed in MAP_SEEDS:
        rng = random.Random(seed)
        plan_id = f"map-crash-{seed}"
        pid, endpoint = pid_endpoint(durable)
        async with AgentClient(endpoint, credentials=credentials()) as client:
            run = asyncio.create_task(
                client.run_plan(_map_plan(plan_id, ledger), timeout=60, request_id=plan_id)
            )
            # Where the kill lands, seeded: after this many of the map's items, a moment later.
            effects = rng.randrange(1, ITEMS)
            await asyncio.to_thread(_wait_for_effects, ledger, plan_id, effects, run)
            await asyncio.sleep(rng.uniform(0, 0.01))
            endpoint = await asyncio.to_thread(kill_and_wait, durable, pid)
            with contextlib.suppress(RemoteError):
                await run
        decided: set[str] = set()
        status = await _drive_map(endpoint, plan_id, ledger, decided)
        if status is None:
            status = await _stored_status(durable, plan_id)
        else:
            held += 1
        gates += len(decided)
        assert status == "succeeded", (seed, status)
    counts = ledger_lines(ledger)
    for seed in MAP_SEEDS:
        for i in range(ITEMS):
            assert counts[f"map-crash-{seed} m.{i}"] == 1, (seed, i)
        assert counts[f"map-crash-{seed} after"] == 1, seed
    print(f"{len(MAP_SEEDS)} kills mid-map, {held} maps resumed, {gates} reconcile gates decided")
    assert_audit_ok(durable)


async def test_a_gate_is_approved_across_a_restart(durable: Deployment) -> None:
    ledger = _ledger(durable)
    plan_id = "gate-across-restart"
    plan = {
        "id": plan_id,
        "owner": "tactical",
        "goal": "wait for a yes, then write",
        "steps": [
            {"kind": "gate", "id": "ok", "prompt": "Write the entry?"},
            {
                "kind": "tool",
                "id": "write",
                "tool": "ledger_append",
                "input": {"ledger": str(ledger)},
                "depends_on": ["ok"],
            },
        ],
    }
    pid, endpoint = pid_endpoint(durable)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        run = asyncio.create_task(client.run_plan(json.dumps(plan), timeout=60))
        await next_stop(client, plan_id)
        assert (await plan_snapshot(client, plan_id)) is not None
        endpoint = await asyncio.to_thread(kill_and_wait, durable, pid)
        with pytest.raises(RemoteError):
            await run
    async with AgentClient(endpoint, credentials=credentials()) as client:
        snapshot = await plan_snapshot(client, plan_id)
        assert snapshot is not None
        assert snapshot.status == "blocked"  # resumed, and waiting for the decision again
        await client.control(plan_id, "approve", gate_id="ok", rationale="approved after restart")
        await next_stop(client, plan_id)
        done = await plan_snapshot(client, plan_id)
    assert done is not None
    assert done.status == "succeeded"
    assert ledger_lines(ledger)[f"{plan_id} write"] == 1
    log = SqliteAuditLog(durable.settings.audit_path)
    try:
        approvals = [r for r in log.records() if r.capability == "Control.approve"]
    finally:
        log.close()
    assert any(
        r.actor == OPERATOR and "gate ok by operator: approved after restart" in r.detail
        for r in approvals
    )
    assert_audit_ok(durable)


async def test_a_replayed_request_gets_the_stored_answer_after_the_target_restarts(
    durable: Deployment,
) -> None:
    ledger = _ledger(durable)
    request = RecordEntryRequest(ledger=str(ledger), plan_id="replayed-entry")
    answers: list[RecordEntryResponse] = []
    pid, endpoint = pid_endpoint(durable)
    for _ in range(2):
        async with AgentClient(endpoint, credentials=credentials()) as client:
            answer = await client.call("tactical", "RecordEntry", request, request_id="entry-1")
        assert isinstance(answer, RecordEntryResponse)
        answers.append(answer)
        if len(answers) == 1:
            endpoint = await asyncio.to_thread(kill_and_wait, durable, pid)
    assert answers[0] == answers[1]
    assert ledger_lines(ledger)["replayed-entry write"] == 1  # the handler ran once
    log = SqliteAuditLog(durable.settings.audit_path)
    try:
        actions = [r.action for r in log.records() if r.request_id == "entry-1"]
    finally:
        log.close()
    assert actions == ["call.accepted", "call.outcome", "call.replayed"]
    assert_audit_ok(durable)
