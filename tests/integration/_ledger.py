"""Driving ledger plans (``tests.integration.ledger_extension``) through kills and restarts.

A ledger plan is a DAG of ``ledger_append`` steps, each appending ``"<plan id> <step id>"`` to a
ledger file when it runs: the file is the effects' system of record. After a kill, ``drive``
follows the resumed plan to its end and decides each reconcile gate from the ledger as
``docs/durability.md`` prescribes: a line present means the effect happened (approve with the
output recorded), no line means it did not (approve a re-run).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from stratagem.planning import PlanStatus
from stratagem.protocol import AgentClient, ClientConfig, Credentials, PlanSnapshot
from tests.integration._auth import credentials

__all__ = ["FINAL", "drive", "ledger_lines", "ledger_plan", "next_stop", "plan_snapshot"]

FINAL = {status.value for status in PlanStatus if status.is_final}


def ledger_lines(ledger: Path) -> Counter[str]:
    """How often each line is in the ledger."""
    if not ledger.exists():
        return Counter()
    return Counter(line for line in ledger.read_text().splitlines() if line)


def ledger_plan(
    plan_id: str, ledger: Path, *, steps: int, width: int, pause_s: float = 0.01
) -> str:
    """A tactical plan of ``steps`` effects in ``width`` chains (step i waits for i - width)."""
    body = [
        {
            "kind": "tool",
            "id": f"s{i}",
            "tool": "ledger_append",
            "input": {"ledger": str(ledger), "pause_s": pause_s},
            "depends_on": [f"s{i - width}"] if i >= width else [],
        }
        for i in range(steps)
    ]
    return json.dumps({"id": plan_id, "owner": "tactical", "goal": "crash me", "steps": body})


def _blocked_steps(snapshot: PlanSnapshot) -> list[str]:
    plan: dict[str, Any] = json.loads(snapshot.plan_json)
    return [step["id"] for step in plan["steps"] if step.get("status") == "blocked"]


async def plan_snapshot(client: AgentClient, plan_id: str) -> PlanSnapshot | None:
    """The agent's snapshot of ``plan_id``, or ``None`` when it does not hold it."""
    found = [s for s in await client.plans(plan_id) if s.plan_id == plan_id]
    return found[0] if found else None


async def next_stop(client: AgentClient, plan_id: str) -> None:
    """Wait for the plan's next plan-level ``blocked`` or final event (stored ones included)."""
    async for event in client.watch(plan_id, timeout=60):
        if not event.step_id and (event.status == "blocked" or event.status in FINAL):
            return


async def drive(
    endpoint: str,
    plan_id: str,
    ledger: Path,
    gates: set[str],
    creds: Credentials | None = None,
) -> str | None:
    """Follow a resumed plan to its end, deciding each reconcile gate from the ledger.

    Returns its final status, or ``None`` when the agent does not hold it (it finished before the
    kill, so nothing was resumed). ``creds`` defaults to the session's operator credentials.
    """
    config = ClientConfig(default_timeout_s=30)
    creds = creds or credentials()
    async with AgentClient(endpoint, credentials=creds, config=config) as client:
        while True:
            snapshot = await plan_snapshot(client, plan_id)
            if snapshot is None or snapshot.status in FINAL:
                return None if snapshot is None else snapshot.status
            for step_id in _blocked_steps(snapshot):
                if step_id in gates:
                    continue
                gates.add(step_id)
                done = ledger_lines(ledger)[f"{plan_id} {step_id}"] > 0
                await client.control(
                    plan_id,
                    "approve",
                    gate_id=step_id,
                    rationale="ledger has the entry" if done else "ledger has no entry",
                    output={"line": f"{plan_id} {step_id}"} if done else None,
                )
            if snapshot.status != "blocked" or not _blocked_steps(snapshot):
                await next_stop(client, plan_id)
