"""A goal in plain words whose orchestrator is killed mid-run resumes, each effect once.

The orchestrator is the real agent in an OS process of its own
(``tests/integration/_orchestrator_process.py``, with the example domain's extension loaded and a
SQLite plan store); the weather, timer and calendar agents it plans onto are served in this process
by ``AgentServer``s over real sockets, each counting the requests it handles. The operator asks
``check the weather in Seattle, set a timer for 10 minutes, then schedule gym on Monday``. The
kill (SIGKILL) lands where it hurts: the timer agent has stored its answer (answers are stored
before they are sent), the orchestrator has not journaled it. The resumed goal (the same store,
the orchestrator now in this process) asks the timer again under the same request id, answered
from the timer's store, and then schedules the event: every side effect happened once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from stratagem.agents import build_agent, import_extensions
from stratagem.planning import PlanStatus, SqliteStateStore
from stratagem.protocol import (
    OPERATOR,
    AgentClient,
    AgentServer,
    AskGoalRequest,
    CallContext,
    CallerMetadataAuthenticator,
    ClientConfig,
    InMemoryAnswerStore,
    InMemoryAuditLog,
    Policy,
    RemoteError,
    WireModel,
)
from stratagem.runtime.host._directory import GrpcDispatcher
from tests.integration._orchestrator_process import RoleDirectory
from tests.unit._registry import registries_kept

pytestmark = pytest.mark.integration

REPO: Final = Path(__file__).resolve().parents[2]
ASSISTANT: Final = "examples.extensions.assistant"
PLAN_ID: Final = "killed-goal"
GOAL: Final = (
    "check the weather in Seattle, set a timer for 10 minutes, then schedule gym on Monday"
)
STARTUP_S: Final = 60.0
"""How long the orchestrator process may take to serve (2 shared cores)."""
DONE_S: Final = 60.0
"""How long the resumed goal may take: it answers in a few seconds; a failure is not a wait."""
POLICY: Final = """
[[allow]]
caller = "orchestrator"
target = "*"
capabilities = ["*"]
"""


@pytest.fixture(autouse=True)
def _kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with registries_kept():
        import_extensions([ASSISTANT])
        yield


class KillingAnswers(InMemoryAnswerStore):
    """An agent's answers; once its first answer is stored, ``kill`` runs (the answer is then
    sent to a caller that is gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.kill: asyncio.Event = asyncio.Event()
        self.killed: asyncio.Event = asyncio.Event()

    async def put(self, caller: str, request_id: str, request_digest: str, answer: bytes) -> None:
        await super().put(caller, request_id, request_digest, answer)
        if not self.kill.is_set():
            self.kill.set()
            await self.killed.wait()


async def test_a_killed_goal_resumes_and_each_side_effect_happens_once(tmp_path: Path) -> None:
    from examples.extensions.assistant import (
        AddEventResponse,
        GetWeatherResponse,
        SetTimerResponse,
    )
    from tests.unit.protocol._support import FakeBackend

    handled: collections.Counter[tuple[str, str]] = collections.Counter()

    async def weather(request: WireModel, ctx: CallContext) -> WireModel:
        handled["GetWeather", ctx.request_id] += 1
        return GetWeatherResponse(
            city="Seattle", temperature_f=52, conditions="cloudy", summary="Seattle: 52°F"
        )

    async def timer(request: WireModel, ctx: CallContext) -> WireModel:
        handled["SetTimer", ctx.request_id] += 1
        return SetTimerResponse(timer_id="timer-1", minutes=10, summary="timer-1: 10 minutes")

    async def event(request: WireModel, ctx: CallContext) -> WireModel:
        handled["AddEvent", ctx.request_id] += 1
        return AddEventResponse(
            event_id="event-1", title="gym", day="monday", summary="gym on monday"
        )

    backends = {role: FakeBackend(role) for role in ("weather", "timer", "calendar")}
    backends["weather"].behaviour["GetWeather"] = weather
    backends["timer"].behaviour["SetTimer"] = timer
    backends["calendar"].behaviour["AddEvent"] = event
    answers = KillingAnswers()
    servers = {
        role: AgentServer(
            backend,
            policy=Policy.from_toml(POLICY),
            authenticator=CallerMetadataAuthenticator(),
            audit=InMemoryAuditLog(),
            answers=answers if role == "timer" else None,
        )
        for role, backend in backends.items()
    }
    for server in servers.values():
        await server.start()
    endpoints = {role: server.endpoint for role, server in servers.items()}
    store_path = tmp_path / "orchestrator.db"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration._orchestrator_process",
        str(store_path),
        json.dumps(endpoints),
        ASSISTANT,
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    client: AgentClient | None = None
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_S)
        kind, _, port = line.decode().strip().partition(" ")
        assert kind == "port", line
        client = AgentClient(
            f"127.0.0.1:{port}", caller=OPERATOR, config=ClientConfig(default_timeout_s=120.0)
        )
        run = asyncio.ensure_future(
            client.call("orchestrator", "AskGoal", AskGoalRequest(goal=GOAL, plan_id=PLAN_ID))
        )
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
    # Killed after the timer was set, before the event: nothing was scheduled yet.
    assert sum(n for (capability, _), n in handled.items() if capability == "SetTimer") == 1
    assert not any(capability == "AddEvent" for capability, _ in handled)

    # Restarted on the same store: the orchestrator resumes the goal where it was.
    store = SqliteStateStore(store_path)
    await store.start()
    dispatcher = GrpcDispatcher("orchestrator", RoleDirectory(endpoints))
    agent = build_agent(
        "orchestrator",
        dispatcher=dispatcher,
        entry_points=False,
        store=store,
        extensions=[ASSISTANT],
    )
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
        assert state.steps["add_event"].output["event_id"] == "event-1"
    finally:
        await agent.aclose()
        await dispatcher.aclose()
        await store.aclose()
        for server in servers.values():
            await server.aclose()
    # Each side effect once: the timer asked again under the same request id was answered from
    # the timer's store, and the event was scheduled once.
    by_capability = collections.Counter(capability for capability, _ in handled.elements())
    assert by_capability["SetTimer"] == 1
    assert by_capability["AddEvent"] == 1
    assert set(handled.values()) == {1}
