"""More durable plans on real Ray: a kill during compensation, budgets and circuit breakers.

A deployment of its own (namespace ``stratagem-durable-more``, its own state directory) runs the
four agents with ``tests.integration.compensation_extension`` loaded: the tactical agent has a
non-idempotent ``effect_append`` tool, its idempotent compensation ``undo_append``, a tool that
always fails with a ``policy`` failure and one that always fails with a ``transient`` one. Plans go
in through ``RunPlan``; the tactical agent's process is killed with SIGKILL (not a polite stop) and
Ray restarts it, and it resumes its unfinished plans from its SQLite store.

What ``docs/durability.md`` promises about a crash during compensation, and what is asserted:
compensations run one at a time in reverse order of completion; a crash leaves the plan
``compensating``; ``resume`` continues with what is not recorded as compensated, and a compensation
in flight at the crash is run again. So, with one kill: the compensating tool is *called* once per
completed step, except at most one step (the one in flight at the kill) called twice in a row;
its effect, deduplicated on the compensated step's ``call_id``, happens exactly once per step in
reverse order of completion; the journal records each step ``compensated`` exactly once, in that
order; the plan ends ``failed``.

It shares the session's Ray with the other integration modules but none of their actors.
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

from stratagem.planning import (
    CompensationRecord,
    CompensationStatus,
    PlanStatus,
    SqliteStateStore,
    StepResult,
    StepStatus,
)
from stratagem.protocol import (
    AgentClient,
    ClientConfig,
    Code,
    PermissionDeniedError,
    RemoteError,
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHAINS = 2
STEPS = 8  # two chains of four effect steps; the failing step waits for both chains' tails
SEEDS = range(20)
FINAL = {status.value for status in PlanStatus if status.is_final}


@pytest.fixture(scope="module")
def durable_more(
    deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """The four agents with the compensation extension, on the session's Ray, removed at the end."""
    with extension_deployment(
        tmp_path_factory.mktemp("durable-more-state"),
        "stratagem-durable-more",
        "tests.integration.compensation_extension",
    ) as ours:
        yield ours


def _wait_for_lines(path: Path, count: int, run: asyncio.Task[Any]) -> None:
    """Block until ``path`` holds ``count`` lines (or the run ended)."""
    while not run.done() and len(file_lines(path)) < count:
        time.sleep(0.001)


async def _final_status(dep: Deployment, endpoint: str, plan_id: str) -> str:
    """Poll the restarted agent until the plan is final; the store's status if it does not hold it
    (the plan ended before the kill, so nothing was resumed)."""
    config = ClientConfig(default_timeout_s=30)
    deadline = time.monotonic() + 60
    async with AgentClient(endpoint, credentials=credentials(), config=config) as client:
        while time.monotonic() < deadline:
            found = [s for s in await client.plans(plan_id) if s.plan_id == plan_id]
            if not found:
                break
            if found[0].status in FINAL:
                return found[0].status
            await asyncio.sleep(0.05)
    async with SqliteStateStore(dep.settings.plans_path("tactical")) as store:
        state = await store.load(plan_id)
    assert state is not None, plan_id
    return state.status.value


def _compensated_plan(plan_id: str, files: dict[str, Path]) -> str:
    steps: list[dict[str, Any]] = [
        {
            "kind": "tool",
            "id": f"s{i}",
            "tool": "effect_append",
            "input": {"ledger": str(files["effects"]), "pause_s": 0.01},
            "depends_on": [f"s{i - CHAINS}"] if i >= CHAINS else [],
            "compensate": "undo_append",
            "compensate_input": {
                "ledger": str(files["undone"]),
                "calls": str(files["calls"]),
                "pause_s": 0.05,
            },
        }
        for i in range(STEPS)
    ]
    steps.append(
        {
            "kind": "tool",
            "id": "last",
            "tool": "refuse",
            "input": {"reason": "the last step says no"},
            "depends_on": [f"s{STEPS - 1 - c}" for c in range(CHAINS)],
        }
    )
    return json.dumps({"id": plan_id, "owner": "tactical", "goal": "undo me", "steps": steps})


async def _journal(dep: Deployment, plan_id: str) -> list[Any]:
    async with SqliteStateStore(dep.settings.plans_path("tactical")) as store:
        return list(await store.journal(plan_id))


async def test_a_kill_during_compensation_resumes_it_and_undoes_each_step_once(
    durable_more: Deployment,
) -> None:
    folder = durable_more.settings.state_dir
    duplicates = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        plan_id = f"compensate-{seed}"
        files = {name: folder / f"{plan_id}.{name}" for name in ("effects", "undone", "calls")}
        pid, endpoint = pid_endpoint(durable_more)
        async with AgentClient(endpoint, credentials=credentials()) as client:
            run = asyncio.create_task(
                client.run_plan(_compensated_plan(plan_id, files), timeout=60, request_id=plan_id)
            )
            # Where the kill lands, seeded: once this many compensations were called, a moment later
            # (within a compensation's pause, or just after it).
            calls = rng.randint(1, STEPS)
            await asyncio.to_thread(_wait_for_lines, files["calls"], calls, run)
            assert not run.done() or calls == STEPS, f"seed {seed}: the plan ended too early"
            await asyncio.sleep(rng.uniform(0, 0.06))
            endpoint = await asyncio.to_thread(kill_and_wait, durable_more, pid)
            # UNAVAILABLE when the agent died under the call; PERMISSION_DENIED when the plan
            # ended (compensated) before the kill.
            with contextlib.suppress(RemoteError):
                await run
        status = await _final_status(durable_more, endpoint, plan_id)
        assert status == "failed", (seed, status)

        journal = await _journal(durable_more, plan_id)
        completed = [
            r.step_id
            for r in journal
            if isinstance(r, StepResult) and r.status is StepStatus.SUCCEEDED
        ]
        assert sorted(completed) == sorted(f"s{i}" for i in range(STEPS)), (seed, completed)
        undo_order = list(reversed(completed))
        # Every effect happened once (the kill landed after the last one).
        effects = file_lines(files["effects"])
        assert sorted(effects) == sorted(f"{plan_id} {step}" for step in completed), seed
        # Each compensation's effect exactly once, in reverse order of completion.
        assert file_lines(files["undone"]) == [
            f"{plan_id} {step} {plan_id}@1:{step}" for step in undo_order
        ], seed
        # The compensating tool was called once per step, but for at most one call in flight at
        # the kill that was made again right after the restart.
        called = [line.split()[1] for line in file_lines(files["calls"])]
        collapsed = [step for i, step in enumerate(called) if i == 0 or called[i - 1] != step]
        assert collapsed == undo_order, (seed, called)
        assert len(called) - len(collapsed) <= 1, (seed, called)
        duplicates += len(called) - len(collapsed)
        # The journal records each step compensated exactly once, in the same order.
        compensated = [
            r.step_id
            for r in journal
            if isinstance(r, CompensationRecord) and r.status is CompensationStatus.COMPENSATED
        ]
        assert compensated == undo_order, (seed, compensated)
        assert not [
            r
            for r in journal
            if isinstance(r, CompensationRecord) and r.status is CompensationStatus.FAILED
        ], seed
    print(f"{len(SEEDS)} kills during compensation, {duplicates} compensation call(s) made twice")
    assert_audit_ok(durable_more)


def _chain(plan_id: str, ledger: Path, steps: int, **extra: Any) -> str:
    plan: dict[str, Any] = {
        "id": plan_id,
        "owner": "tactical",
        "goal": "a chain of effects",
        "steps": [
            {
                "kind": "tool",
                "id": f"s{i}",
                "tool": "effect_append",
                "input": {"ledger": str(ledger)},
                "depends_on": [f"s{i - 1}"] if i else [],
            }
            for i in range(steps)
        ],
        **extra,
    }
    return json.dumps(plan)


async def test_an_exhausted_budget_stops_the_plan_with_a_policy_failure(
    durable_more: Deployment,
) -> None:
    ledger = durable_more.settings.state_dir / "budget.effects"
    plan_id = "budget-calls"
    _, endpoint = pid_endpoint(durable_more)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        with pytest.raises(PermissionDeniedError) as raised:
            await client.run_plan(_chain(plan_id, ledger, 5, budget={"tool_calls": 3}), timeout=60)
    error = raised.value
    assert error.code is Code.PERMISSION_DENIED
    assert "budget exhausted: tool_calls 3/3 used; step 's3' needs 1 more" in error.message
    assert f"plan {plan_id!r} step 's3' failed (policy)" in error.message
    assert file_lines(ledger) == [f"{plan_id} s{i}" for i in range(3)]  # s3 and s4 never ran
    assert await _final_status(durable_more, endpoint, plan_id) == "failed"


def _flaky(plan_id: str, calls: Path, attempts: int) -> str:
    step = {
        "kind": "tool",
        "id": "call",
        "tool": "always_unavailable",
        "input": {"calls": str(calls)},
        "retry": {"max_attempts": attempts, "initial_backoff_s": 0.0, "max_backoff_s": 0.0},
    }
    return json.dumps({"id": plan_id, "owner": "tactical", "goal": "call it", "steps": [step]})


async def test_an_open_circuit_stops_plans_and_stays_open_across_a_restart(
    durable_more: Deployment,
) -> None:
    calls = durable_more.settings.state_dir / "breaker.calls"
    circuit = "circuit open for tool 'always_unavailable' after 5 failures"
    pid, endpoint = pid_endpoint(durable_more)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        # Five transient failures open the breaker (the default threshold); the sixth attempt
        # is refused without calling the tool.
        with pytest.raises(PermissionDeniedError) as raised:
            await client.run_plan(_flaky("breaker-1", calls, attempts=6), timeout=60)
        assert raised.value.code is Code.PERMISSION_DENIED
        assert circuit in raised.value.message, raised.value.message
        assert len(file_lines(calls)) == 5
        # A new plan calling the tool fails at once, without calling it.
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError) as raised:
            await client.run_plan(_flaky("breaker-2", calls, attempts=3), timeout=60)
        assert circuit in raised.value.message, raised.value.message
        assert "step 'call' failed (policy)" in raised.value.message
        assert time.monotonic() - started < 5
        assert len(file_lines(calls)) == 5

    # The breaker is stored: the restarted agent starts with it open (within its 30 s).
    endpoint = await asyncio.to_thread(kill_and_wait, durable_more, pid)
    async with AgentClient(endpoint, credentials=credentials()) as client:
        with pytest.raises(PermissionDeniedError) as raised:
            await client.run_plan(_flaky("breaker-3", calls, attempts=3), timeout=60)
    assert raised.value.code is Code.PERMISSION_DENIED
    assert circuit in raised.value.message, raised.value.message
    assert len(file_lines(calls)) == 5  # never called after it opened, restart or not
    assert_audit_ok(durable_more)
