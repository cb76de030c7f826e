"""Memory as tools of a plan: granted by the policy, checked per namespace, audited, traced, and
shown as the step's output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.agents import (
    Agent,
    InMemoryMemoryStore,
    MemoryItem,
    MemoryStore,
    PolicedMemory,
    SqliteMemoryStore,
    StrategicAgent,
    ToolRegistry,
    memory_tools,
)
from stratagem.planning import Plan, PlanResult, SqliteStateStore
from stratagem.protocol import (
    CallContext,
    FailedPreconditionError,
    InMemoryAuditLog,
    PermissionDeniedError,
    Policy,
    WireModel,
)

CTX = CallContext(caller="operator", target="strategic", capability="RunPlan", request_id="r")


def _plan(plan_id: str, steps: list[dict[str, Any]]) -> str:
    return json.dumps({"id": plan_id, "owner": "strategic", "goal": "remember", "steps": steps})


def _put(step: str, namespace: str, key: Any, value: Any, **more: Any) -> dict[str, Any]:
    data = {"namespace": namespace, "key": key, "value": value, **more}
    return {"kind": "tool", "id": step, "tool": "memory.put", "input": data}


OWN = Policy.from_toml(
    '[[memory]]\ncaller = "*"\nnamespaces = ["agent/{caller}"]\naccess = ["read", "write"]\n'
)
"""Each agent its own namespace (the rule docs/artifacts-memory.md shows)."""


def test_the_policy_decides_which_memory_tools_an_agent_gets() -> None:
    store = InMemoryMemoryStore()
    # The shipped policy gives agents no memory: their tools stay as they were.
    assert memory_tools(PolicedMemory(store, Policy.default(), "strategic")) == []
    assert [t.name for t in memory_tools(PolicedMemory(store, OWN, "strategic"))] == [
        "memory.put",
        "memory.get",
        "memory.search",
    ]
    reader = Policy.from_toml(
        '[[memory]]\ncaller = "a"\nnamespaces = ["goal/*"]\naccess = ["read"]'
    )
    assert [t.name for t in memory_tools(PolicedMemory(store, reader, "a"))] == [
        "memory.get",
        "memory.search",
    ]
    assert memory_tools(PolicedMemory(store, reader, "b")) == []
    put = memory_tools(PolicedMemory(store, OWN, "strategic"))[0]
    # Exactly-once under the engine's rules: an interrupted put is run again on resume.
    assert (put.side_effects, put.idempotent) == (True, True)


async def test_a_plan_puts_gets_and_searches_memory_traced_and_audited() -> None:
    store = InMemoryMemoryStore()
    audit = InMemoryAuditLog()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    memory = PolicedMemory(store, OWN, "strategic", audit)
    agent = StrategicAgent(tools=memory_tools(memory), tracer_provider=provider)
    plan = _plan(
        "remember",
        [
            _put("keep", "agent/strategic", "theme", {"text": "a lighthouse keeper's loyalty"}),
            {
                "kind": "tool",
                "id": "recall",
                "tool": "memory.search",
                "input": {"namespace": "agent/strategic", "query": "lighthouse"},
                "depends_on": ["keep"],
            },
            {
                "kind": "tool",
                "id": "read",
                "tool": "memory.get",
                "input": {"namespace": ["agent", "strategic"], "key": "theme"},
                "depends_on": ["keep"],
            },
        ],
    )
    snapshot = await agent.run_plan(plan, CTX)
    assert snapshot.status == "succeeded"
    result = agent.record("remember").result
    assert result is not None
    outputs = result.outputs  # what `plans show` shows of each step
    recalled = outputs["recall"]["items"]
    assert [(i["namespace"], i["key"]) for i in recalled] == [("agent/strategic", "theme")]
    assert outputs["read"]["found"] is True
    assert outputs["read"]["item"]["value"] == {"text": "a lighthouse keeper's loyalty"}
    assert outputs["keep"]["key"] == "theme"
    assert [(r.action, r.actor, r.target) for r in audit.records()] == [
        ("memory.put", "strategic", "agent/strategic")
    ]
    tool_spans = {
        span.attributes.get("stratagem.step.id"): span
        for span in exporter.get_finished_spans()
        if span.attributes and "stratagem.memory.namespace" in span.attributes
    }
    assert set(tool_spans) == {"keep", "recall", "read"}
    assert tool_spans["recall"].attributes["stratagem.memory.hits"] == 1  # type: ignore[index]
    assert tool_spans["keep"].attributes["stratagem.memory.key"] == "theme"  # type: ignore[index]


@pytest.mark.parametrize(
    ("step", "refusal", "message"),
    [
        (_put("s", "user/ana", "k", 1), PermissionDeniedError, "(policy): namespace: 'strategic'"),
        (_put("s", "agent/strategic", 7, 1), FailedPreconditionError, "key"),
        (_put("s", "agent/strategic", "k", "x" * 70_000), FailedPreconditionError, "value: is"),
        (_put("s", "agent/strategic", "k", 1, ttl_s=0), FailedPreconditionError, "ttl_s: must"),
        (_put("s", "agent/../x", "k", 1), FailedPreconditionError, "namespace: part '..'"),
    ],
)
async def test_a_step_with_bad_memory_input_fails_naming_it_and_writes_nothing(
    step: dict[str, Any], refusal: type[Exception], message: str
) -> None:
    store = InMemoryMemoryStore()
    agent = StrategicAgent(tools=memory_tools(PolicedMemory(store, OWN, "strategic")))
    with pytest.raises(refusal) as caught:
        await agent.run_plan(_plan("bad", [step]), CTX)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert await store.list(("agent",)) == []
    assert await store.list(("user",)) == []


class _HeldStore(SqliteMemoryStore):
    """A memory file whose put waits, after its write, until ``hold`` is set: the process can
    stop between the write and the step's recorded result (the case a crash leaves)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hold = asyncio.Event()
        self.written = asyncio.Event()
        self.puts = 0

    async def put(self, *args: Any, **kwargs: Any) -> MemoryItem:
        item = await super().put(*args, **kwargs)
        self.puts += 1
        self.written.set()
        await self.hold.wait()
        return item


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("this test submits its plan")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("this test submits its plan")


def _durable(store: SqliteStateStore, memory: MemoryStore) -> Agent:
    registry = ToolRegistry("strategic")
    for item in memory_tools(PolicedMemory(memory, OWN, "strategic")):
        registry.register(item)
    return Agent("strategic", registry, Plan, _NoPlanner(), store=store)


async def test_a_put_interrupted_after_its_write_runs_again_on_resume_leaving_one_item(
    tmp_path: Path,
) -> None:
    plan = Plan.model_validate(
        {
            "id": "remember",
            "owner": "strategic",
            "goal": "remember",
            "steps": [_put("keep", "agent/strategic", "theme", {"text": "loyalty"})],
        }
    )
    memory = _HeldStore(tmp_path / "memory.sqlite3")
    await memory.start()
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as first:
        agent = _durable(first, memory)
        run = asyncio.create_task(agent.submit_plan(plan))
        await memory.written.wait()
        agent.closing()  # the process stops after the write, before the step's result is kept
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    await memory.aclose()
    kept = SqliteMemoryStore(tmp_path / "memory.sqlite3")
    await kept.start()
    first_item = await kept.get(("agent", "strategic"), "theme")
    assert first_item is not None
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as second:
        restarted = _durable(second, kept)
        assert await restarted.resume_unfinished() == ["remember"]
        for _ in range(200):  # no gate: an idempotent step in flight runs again by itself
            [snapshot] = restarted.plans("remember")
            if snapshot.status in ("succeeded", "failed", "blocked"):
                break
            await asyncio.sleep(0.05)
        assert snapshot.status == "succeeded"
        await restarted.aclose()
    items = await kept.list(("agent",))
    assert [(item.key, item.value) for item in items] == [("theme", {"text": "loyalty"})]
    assert items[0].created_at == first_item.created_at  # the same item, written again
    await kept.aclose()
