"""An agent's history: its plans served from its store (real SQLite files) whatever it holds in
memory — what each step did, redacted as the audit log redacts, cut to fit; refused plans with
their trace; watch replaying stored events after a restart; a store that cannot be read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from stratagem.agents import Agent, ToolRegistry, tool
from stratagem.planning import (
    GateStep,
    LogicError,
    Plan,
    PlanResult,
    SqliteStateStore,
    StateStore,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    CallContext,
    InvalidArgumentError,
    PlanSnapshot,
    PlansQuery,
    WireModel,
)

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("these tests run their own plans")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("these tests run their own plans")


def _agent(store: StateStore | None) -> Agent:
    registry = ToolRegistry("strategic")

    @tool(name="login")
    async def login(user: str) -> dict[str, Any]:
        """Return a session with a secret in it."""
        return {"user": user, "api_key": "sk-123", "note": "password=hunter2 and more"}

    @tool(name="echo")
    async def echo(text: str, session: dict[str, Any]) -> dict[str, Any]:
        """Repeat the text."""
        return {"text": text, "seen": sorted(session)}

    @tool(name="refuse")
    async def refuse(text: str) -> dict[str, Any]:
        """Fail for good."""
        raise LogicError(f"cannot use {text!r}")

    for item in (login, echo, refuse):
        registry.register(item)
    return Agent("strategic", registry, Plan, _NoPlanner(), store=store)


def _plan(plan_id: str, *, fail: bool = False, text: str = "hello") -> Plan:
    return Plan(
        id=plan_id,
        owner="strategic",
        goal="say hello",
        steps=[
            ToolStep(id="login", tool="login", input={"user": "mira"}),
            ToolStep(
                id="echo",
                tool="refuse" if fail else "echo",
                input={"text": text} if fail else {"text": text, "session": ref("login.result")},
                depends_on=["login"],
            ),
        ],
    )


async def _page(agent: Agent, **query: Any) -> list[PlanSnapshot]:
    return (await agent.history(PlansQuery(**query), 1 << 20)).plans


async def test_each_step_says_what_it_did(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        await agent.submit_plan(_plan("ok"))
        await agent.submit_plan(_plan("bad", fail=True))
        (ok,) = await _page(agent, plan_id="ok", view="steps")
        assert ok.status == "succeeded"
        login, echo = ok.steps
        assert (login.kind, login.does, login.attempts, login.revision) == ("tool", "login", 1, 1)
        assert 0 < login.started <= login.ended <= echo.started <= echo.ended
        # The input it ran with: the reference resolved against the recorded output.
        assert json.loads(echo.input_json)["session"]["user"] == "mira"
        assert json.loads(echo.output_json) == {
            "result": {"text": "hello", "seen": ["api_key", "note", "user"]}
        }
        assert echo.depends_on == ["login"]
        (bad,) = await _page(agent, plan_id="bad", view="steps")
        assert bad.status == "failed"
        assert bad.message.startswith("step 'echo' failed (logic): cannot use 'hello'")
        failed = bad.steps[1]
        assert (failed.status, failed.failure_class) == ("failed", "logic")
        assert failed.message == "cannot use 'hello'"
        # The plan as JSON carries each step's status, from the journal.
        body = json.loads(bad.plan_json)
        assert [s["status"] for s in body["steps"]] == ["succeeded", "failed"]
        with pytest.raises(InvalidArgumentError, match="unknown plan status 'done'"):
            await _page(agent, status="done")


async def test_values_are_redacted_as_the_audit_log_redacts(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        await agent.submit_plan(_plan("secret", text="token=abc123 please"))
        (shown,) = await _page(agent, plan_id="secret", view="steps")
        login, echo = shown.steps
        output = json.loads(login.output_json)["result"]
        assert output["api_key"] == "***"
        assert output["note"] == "password=*** and more"
        assert json.loads(echo.input_json)["text"] == "token=*** please"
        assert json.loads(echo.input_json)["session"]["api_key"] == "***"
        assert "abc123" not in shown.plan_json
        assert "sk-123" not in shown.model_dump_json()


async def test_long_values_are_cut_unless_asked_whole_and_then_fit_the_limit(
    tmp_path: Path,
) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        await agent.submit_plan(_plan("long", text="x" * 5000))
        (preview,) = await _page(agent, plan_id="long", view="steps")
        echo = preview.steps[1]
        assert echo.cut
        assert json.loads(echo.output_json)["result"]["text"] == "x" * 400 + "…"
        (whole,) = await _page(agent, plan_id="long", view="steps", full=True)
        assert not whole.steps[1].cut
        assert json.loads(whole.steps[1].output_json)["result"]["text"] == "x" * 5000
        # A message limit smaller than the values: cut to fit, and said so.
        page = await agent.history(
            PlansQuery(plan_id="long", view="steps", full=True), max_bytes=4096 + 4000
        )
        (small,) = page.plans
        assert small.steps[1].cut
        assert small.size_hint() < 4096 + 4000


async def test_history_survives_the_agent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStateStore(path) as store:
        agent = _agent(store)
        for n in range(3):
            await agent.submit_plan(_plan(f"p{n}"))
        await agent.aclose()
    async with SqliteStateStore(path) as store:
        again = _agent(store)  # a new agent on the same store: nothing in memory
        assert again.plans("") == []
        listed = await _page(again, view="summary")
        assert [s.plan_id for s in listed] == ["p2", "p1", "p0"]
        assert all(s.plan_json == "" and s.created > 0 for s in listed)
        first = await again.history(PlansQuery(page_size=2), 1 << 20)
        assert [s.plan_id for s in first.plans] == ["p2", "p1"]
        rest = await again.history(PlansQuery(page_token=first.next_page_token), 1 << 20)
        assert [s.plan_id for s in rest.plans] == ["p0"]
        assert rest.next_page_token == ""
        # Watch replays the stored events of a plan no longer in memory, and ends.
        events = [e async for e in again.watch("p1")]
        assert [(e.step_id, e.status) for e in events] == [
            ("", "running"),
            ("login", "running"),
            ("login", "succeeded"),
            ("echo", "running"),
            ("echo", "succeeded"),
            ("", "succeeded"),
        ]
        assert all(e.agent == "strategic" and e.timestamp > 0 for e in events)


async def test_a_refused_plan_is_stored_with_its_reason_and_trace(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        bad = Plan(
            id="refused",
            owner="strategic",
            goal="use a tool it has not",
            steps=[ToolStep(id="x", tool="fly", input={})],
        )
        parent = SpanContext(TRACE, 0x1234, is_remote=True, trace_flags=TraceFlags(1))
        context = trace.set_span_in_context(NonRecordingSpan(parent))
        ctx = CallContext(
            caller="operator", target="strategic", capability="RunPlan", request_id="r"
        )
        from opentelemetry import context as context_api

        token = context_api.attach(context)
        try:
            with pytest.raises(Exception, match="refused"):
                await agent.run_plan(bad.model_dump_json(), ctx)
        finally:
            context_api.detach(token)
        again = _agent(store)
        (shown,) = await _page(again, plan_id="refused")
        assert shown.status == "failed"
        assert "'fly'" in shown.message
        assert shown.trace_id == f"{TRACE:032x}"


async def test_a_store_that_cannot_be_read_answers_from_memory_and_says_so(
    tmp_path: Path,
) -> None:
    store = SqliteStateStore(tmp_path / "s.db")
    agent = _agent(store)
    await agent.submit_plan(_plan("kept"))
    await store.aclose()  # every read now fails
    page = await agent.history(PlansQuery(), 1 << 20)
    assert [s.plan_id for s in page.plans] == ["kept"]
    assert len(page.unreadable) == 1
    assert "store cannot be read" in page.unreadable[0]
    assert "in memory" in page.unreadable[0]


async def test_a_run_plan_answers_when_the_plan_blocks_and_its_deadline_never_cancels_it(
    tmp_path: Path,
) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        hold = asyncio.Event()

        @tool(name="slow")
        async def slow(text: str) -> dict[str, Any]:
            """Wait until let go."""
            await hold.wait()
            return {"text": text}

        agent.registry.register(slow)
        ctx = CallContext(
            caller="operator", target="strategic", capability="RunPlan", request_id="r"
        )

        def gated(plan_id: str) -> Plan:
            return Plan(
                id=plan_id,
                owner="strategic",
                goal="wait",
                steps=[
                    ToolStep(id="first", tool="slow", input={"text": "a"}),
                    GateStep(id="ok", prompt="Go ahead?", depends_on=["first"]),
                    ToolStep(id="login", tool="login", input={"user": "a"}, depends_on=["ok"]),
                ],
            )

        # The caller gives up (its deadline) before the plan reaches its gate: the plan runs on.
        call = asyncio.create_task(
            agent.run_plan(gated("gated").model_dump_json(), ctx, until_blocked=True)
        )
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        hold.set()
        for _ in range(100):
            (shown,) = await _page(agent, plan_id="gated", view="steps")
            if shown.status == "blocked":
                break
            await asyncio.sleep(0.02)
        assert shown.status == "blocked"
        assert shown.steps[1].message == "waiting for approval: Go ahead?"
        # A caller that waits: the answer comes as soon as the plan blocks.
        blocked = await agent.run_plan(gated("gated-2").model_dump_json(), ctx, until_blocked=True)
        assert (blocked.status, blocked.steps[1].status) == ("blocked", "blocked")
        await agent.decide_gate(
            "gated", "ok", approve=True, approver="operator", rationale="fine", revision=None
        )
        for _ in range(100):
            (shown,) = await _page(agent, plan_id="gated", view="steps")
            if shown.status == "succeeded":
                break
            await asyncio.sleep(0.02)
        assert shown.status == "succeeded"
        assert shown.steps[1].message == "approved by operator: fine"
        statuses = [e.status async for e in agent.watch("gated") if not e.step_id]
        assert statuses[-1] == "succeeded"
        await agent.aclose()


async def test_the_retention_deletes_old_and_surplus_finished_plans(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = _agent(store)
        for n in range(4):
            await agent.submit_plan(_plan(f"p{n}"))
        assert await agent.prune_history(keep=2) == 2
        assert [s.plan_id for s in await _page(agent, view="summary")] == ["p3", "p2"]
        assert await agent.prune_history(older_than_s=3600) == 0  # none is that old
        assert await agent.prune_history(older_than_s=0.0) == 2
        assert await _page(agent) == []
        assert await _agent(None).prune_history(keep=1) == 0  # no store: nothing to do


async def test_a_steps_input_is_shown_as_its_tool_received_it(tmp_path: Path) -> None:
    """Expressions over the plan's ``inputs`` included: they showed null (issue 32)."""
    received: dict[str, dict[str, Any]] = {}
    registry = ToolRegistry("strategic")

    @tool(name="note")
    async def note(text: str, tension: Any, session: Any = None) -> dict[str, Any]:
        """Record what it was given."""
        received[text] = {"text": text, "tension": tension, "session": session}
        return {"user": text}

    registry.register(note)
    plan = Plan(
        id="given",
        owner="strategic",
        goal="show what ran",
        inputs={"text": "Mira waits.", "hint": "high"},
        steps=[
            ToolStep(
                id="first",
                tool="note",
                input={"text": {"$expr": "inputs.text"}, "tension": {"$expr": "inputs.hint"}},
            ),
            ToolStep(
                id="second",
                tool="note",
                depends_on=["first"],
                input={
                    "text": "again",
                    "tension": {"$expr": "join(' ', [inputs.hint, first.result.user])"},
                    "session": ref("first.result.user"),
                },
            ),
        ],
    )
    async with SqliteStateStore(tmp_path / "s.db") as store:
        agent = Agent("strategic", registry, Plan, _NoPlanner(), store=store)
        await agent.submit_plan(plan)
        (shown,) = await _page(agent, plan_id="given", view="steps")
    first, second = (json.loads(step.input_json) for step in shown.steps)
    assert first == {"text": "Mira waits.", "tension": "high"}  # "tension": null before
    assert received["Mira waits."] == first | {"session": None}  # the tool's default
    assert second == {"text": "again", "tension": "high Mira waits.", "session": "Mira waits."}
    assert received["again"] == second
