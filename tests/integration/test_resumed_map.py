"""A cross-agent map whose orchestrator is killed mid-way resumes and completes, each item once.

The orchestrator is the real agent in an OS process of its own
(``tests/integration/_orchestrator_process.py``) with a SQLite plan store; the perception agent it
maps over is served in this process by an ``AgentServer`` over real sockets. The operator runs the
plan with ``RunPlan``, so the map's requests carry the delegation chain ``["operator"]``. The kill
lands where it hurts: perception has stored its answer to item 17 (answers are stored before they
are sent), the orchestrator has not journaled it. The resumed plan (the same store, the orchestrator
agent now in this process: nobody delegated it) asks item 17 again under the same request id,
without a delegation chain: the same request, answered from perception's store.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
from pathlib import Path
from typing import Final

import pytest

from stratagem.agents import build_agent
from stratagem.planning import PlanStatus, SqliteStateStore
from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    AgentServer,
    CallContext,
    CallerMetadataAuthenticator,
    ClientConfig,
    ExtractEntitiesResponse,
    InMemoryAnswerStore,
    InMemoryAuditLog,
    Policy,
    RemoteError,
    WireModel,
)
from stratagem.runtime.host._directory import GrpcDispatcher
from tests.integration._orchestrator_process import FixedDirectory

pytestmark = pytest.mark.integration

REPO: Final = Path(__file__).resolve().parents[2]
ITEMS: Final = 30
KILLED_AT: Final = 17
"""The item whose answer perception stores just before the orchestrator is killed."""
PLAN_ID: Final = "resumed-map"
STARTUP_S: Final = 60.0
"""How long the orchestrator process may take to serve (2 shared cores)."""
DONE_S: Final = 60.0
"""How long the resumed map may take: it answers in a few seconds; a failure is not a wait."""

PLAN: Final = {
    "id": PLAN_ID,
    "owner": "orchestrator",
    "goal": "Read every passage",
    "inputs": {"passages": [f"Mira waits in room {index}." for index in range(ITEMS)]},
    "steps": [
        {
            "kind": "map",
            "id": "read",
            "over": "inputs.passages",
            "max_items": ITEMS,
            "max_parallel": 1,
            "target": "perception",
            "capability": "ExtractEntities",
            "request": {"text": {"$expr": "item"}},
        }
    ],
}


class KillingAnswers(InMemoryAnswerStore):
    """Perception's answers; once the answer to ``request_id`` is stored, ``kill`` runs (the
    answer is then sent to a caller that is gone)."""

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.kill: asyncio.Event = asyncio.Event()
        self.killed: asyncio.Event = asyncio.Event()

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        await super().put(caller, request_id, request_digest, answer)
        if request_id == self.request_id and not self.kill.is_set():
            self.kill.set()
            await self.killed.wait()


async def test_a_resumed_cross_agent_map_completes_each_item_once(tmp_path: Path) -> None:
    handled: collections.Counter[str] = collections.Counter()
    delegations: dict[str, list[tuple[str, ...]]] = collections.defaultdict(list)

    async def extract(request: WireModel, ctx: CallContext) -> WireModel:
        handled[ctx.request_id] += 1
        delegations[ctx.request_id].append(ctx.delegation)
        return ExtractEntitiesResponse(entities=[])

    from tests.unit.protocol._support import FakeBackend

    backend = FakeBackend("perception")
    backend.behaviour["ExtractEntities"] = extract
    answers = KillingAnswers(f"{PLAN_ID}@1:read.{KILLED_AT}")
    perception = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=CallerMetadataAuthenticator(),
        audit=InMemoryAuditLog(),
        answers=answers,
    )
    await perception.start()
    store_path = tmp_path / "orchestrator.db"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration._orchestrator_process",
        str(store_path),
        perception.endpoint,
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    client: AgentClient | None = None
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_S)
        event, _, port = line.decode().strip().partition(" ")
        assert event == "port", line
        client = AgentClient(
            f"127.0.0.1:{port}", caller=OPERATOR, config=ClientConfig(default_timeout_s=120.0)
        )
        run = asyncio.ensure_future(client.run_plan(json.dumps(PLAN)))
        await asyncio.wait_for(answers.kill.wait(), DONE_S)
        os.kill(process.pid, signal.SIGKILL)
        await process.wait()
        answers.killed.set()
        with pytest.raises(RemoteError):  # the orchestrator died under its caller
            await asyncio.wait_for(run, DONE_S)
    finally:
        answers.killed.set()
        if process.returncode is None:
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()
        if client is not None:
            await client.aclose()
    assert handled[f"{PLAN_ID}@1:read.{KILLED_AT}"] == 1
    assert delegations[f"{PLAN_ID}@1:read.0"] == [(OPERATOR,)]

    # Restarted on the same store: the orchestrator resumes the map where it was.
    store = SqliteStateStore(store_path)
    await store.start()
    dispatcher = GrpcDispatcher("orchestrator", FixedDirectory(perception.endpoint))
    agent = build_agent("orchestrator", dispatcher=dispatcher, entry_points=False, store=store)
    try:
        assert await agent.resume_unfinished() == [PLAN_ID]
        state = None
        for _ in range(int(DONE_S / 0.1)):
            state = await store.load(PLAN_ID)
            if state is not None and state.status.is_final:
                break
            await asyncio.sleep(0.1)
        assert state is not None
        failures = [step.message for step in state.steps.values() if step.message]
        assert state.status is PlanStatus.SUCCEEDED, failures
        assert state.revision == 1
        items = state.steps["read"].output["items"]
        assert len(items) == ITEMS
    finally:
        await agent.aclose()
        await dispatcher.aclose()
        await store.aclose()
        await perception.aclose()
    # Every item was handled once: item 17 again was answered from perception's store.
    assert sorted(handled) == sorted(f"{PLAN_ID}@1:read.{index}" for index in range(ITEMS))
    assert set(handled.values()) == {1}
