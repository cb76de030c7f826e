"""An agent's gates: who may decide (its policy's roles and deciders), values and edited
arguments over ``Control``, each bad input refused with its status and nothing applied, tool
approvals from the policy (a model's plan too), forks, and gates in snapshots and events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import (
    Agent,
    ModelPlanner,
    ModelPlanningConfig,
    ScriptedModelClient,
    ToolRegistry,
    tool,
)
from stratagem.planning import (
    GateStep,
    Plan,
    PlanResult,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    CallContext,
    ControlRequest,
    ExtractEntitiesRequest,
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    PlanEvent,
    Policy,
    ProtocolUsageError,
    WireModel,
)

POLICY = """
[[allow]]
caller = "operator"
target = "*"
capabilities = ["*"]

[roles]
leads = ["ana", "bo"]

[[gate]]
agent = "perception"
deciders = ["role:leads"]

[[approval]]
agent = "perception"
tool = "record"
when = "arguments.amount > `10`"
deciders = ["ana"]
"""


class _NoPlanner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise AssertionError("these tests submit their plans")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise AssertionError("these tests submit their plans")


class Book:
    """What the side-effecting tool recorded, one entry per call."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int]] = []


def _registry(book: Book) -> ToolRegistry:
    registry = ToolRegistry("perception")

    @tool(name="record", side_effects=True)
    async def record(amount: int, ctx: ToolContext) -> dict[str, int]:
        """Record an amount (an effect per call)."""
        book.entries.append((f"{ctx.plan_id} {ctx.step_id}", amount))
        return {"amount": amount}

    registry.register(record)
    return registry


def _agent(store: SqliteStateStore, book: Book, policy: Policy | None = None) -> Agent:
    agent = Agent("perception", _registry(book), Plan, _NoPlanner(), store=store)
    agent.use_policy(policy or Policy.from_toml(POLICY))
    return agent


def _ctx(caller: str, action: str) -> CallContext:
    return CallContext(
        caller=caller, target="perception", capability=f"Control.{action}", request_id="r"
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStateStore]:
    async with SqliteStateStore(tmp_path / "plans.sqlite3") as opened:
        yield opened


async def _until(agent: Agent, plan_id: str, status: PlanStatus) -> list[PlanEvent]:
    seen = []
    async for event in agent.watch(plan_id):
        seen.append(event)
        if event.plan_id == plan_id and not event.step_id and event.status == status.value:
            return seen
    raise AssertionError("the stream ended")


ASKING = Plan(
    id="asks",
    owner="perception",
    goal="record what is asked",
    steps=[
        GateStep(
            id="how",
            prompt="How much?",
            input_schema={
                "type": "object",
                "properties": {"amount": {"type": "integer", "maximum": 10}},
                "required": ["amount"],
            },
        ),
        ToolStep(
            id="rec", tool="record", input={"amount": ref("how.value.amount")}, depends_on=["how"]
        ),
    ],
)


async def test_control_refuses_others_bad_values_and_closed_gates_and_applies_nothing(
    store: SqliteStateStore,
) -> None:
    book = Book()
    agent = _agent(store, book)
    run = asyncio.create_task(agent.submit_plan(ASKING))
    events = await _until(agent, "asks", PlanStatus.BLOCKED)
    opened = next(e for e in events if e.step_id == "how")
    assert opened.gate is not None
    assert json.loads(opened.gate.input_schema_json)["required"] == ["amount"]

    def approve(**fields: Any) -> ControlRequest:
        return ControlRequest(plan_id="asks", action="approve", gate_id="how", **fields)

    # An identity the gate's policy does not name: PERMISSION_DENIED.
    with pytest.raises(PermissionDeniedError, match="'operator' may not decide gate 'how'"):
        await agent.control(approve(value_json='{"amount": 3}'), _ctx("operator", "approve"))
    # A value that does not fit: INVALID_ARGUMENT naming the field.
    with pytest.raises(InvalidArgumentError) as info:
        await agent.control(approve(value_json='{"amount": 30}'), _ctx("bo", "approve"))
    assert [(v.field, v.description) for v in info.value.violations] == [
        ("value.amount", "30 is greater than the maximum of 10")
    ]
    with pytest.raises(InvalidArgumentError, match="value_json is not valid JSON"):
        await agent.control(approve(value_json="{"), _ctx("bo", "approve"))
    snapshot = agent.plans("asks")[0]
    assert snapshot.status == "blocked"  # nothing applied
    assert [g.event for g in snapshot.gates] == ["opened"]
    assert snapshot.gates[0].deciders == []  # the gate names none: the policy's apply
    done = await agent.control(
        approve(value_json='{"amount": 4}', rationale="four"), _ctx("bo", "approve")
    )
    assert done.plan_id == "asks"
    result = await run
    assert result.status is PlanStatus.SUCCEEDED
    assert book.entries == [("asks rec", 4)]
    # A decision on a closed gate: FAILED_PRECONDITION.
    with pytest.raises(FailedPreconditionError, match="already"):
        await agent.control(approve(value_json='{"amount": 4}'), _ctx("bo", "approve"))
    decided = agent.plans("asks")[0].gates[0]
    assert (decided.decision, decided.approver, json.loads(decided.value_json)) == (
        "approved",
        "bo",
        {"amount": 4},
    )


async def test_a_tool_approval_from_the_policy_with_edited_arguments(
    store: SqliteStateStore,
) -> None:
    book = Book()
    agent = _agent(store, book)
    plan = Plan(
        id="pay",
        owner="perception",
        goal="record two amounts",
        steps=[
            ToolStep(id="small", tool="record", input={"amount": 5}),
            ToolStep(id="large", tool="record", input={"amount": 50}, depends_on=["small"]),
        ],
    )
    run = asyncio.create_task(agent.submit_plan(plan))
    events = await _until(agent, "pay", PlanStatus.BLOCKED)
    gate = next(e for e in events if e.step_id == "large").gate
    assert gate is not None
    assert (gate.kind, gate.tool, json.loads(gate.arguments_json), gate.deciders) == (
        "tool",
        "record",
        {"amount": 50},
        ["ana"],
    )
    approve = ControlRequest(
        plan_id="pay", action="approve", gate_id="large", arguments_json='{"amount": "lots"}'
    )
    with pytest.raises(InvalidArgumentError) as info:
        await agent.control(approve, _ctx("ana", "approve"))
    assert info.value.violations[0].field == "arguments.amount"
    with pytest.raises(PermissionDeniedError):
        await agent.control(
            approve.model_copy(update={"arguments_json": '{"amount": 20}'}), _ctx("bo", "approve")
        )
    await agent.control(
        approve.model_copy(update={"arguments_json": '{"amount": 20}', "rationale": "cap it"}),
        _ctx("ana", "approve"),
    )
    result = await run
    assert result.status is PlanStatus.SUCCEEDED
    assert book.entries == [("pay small", 5), ("pay large", 20)]
    history = await agent.revisions("pay")
    assert (history.revisions[-1].revision, history.revisions[-1].author) == (2, "ana")


async def test_a_models_plan_waits_at_the_approval_its_tool_needs(
    store: SqliteStateStore,
) -> None:
    book = Book()
    agent = _agent(store, book)
    answer = json.dumps(
        {
            "goal": "record one amount",
            "steps": [{"id": "one", "tool": "record", "input": {"amount": 11}}],
        }
    )
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=agent.registry,
        client=ScriptedModelClient([answer], model="tiny"),
        deterministic=_NoPlanner(),
        config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0)),
    )
    plan = await planner.plan(
        "ExtractEntities", ExtractEntitiesRequest(text="x"), plan_id="model-made"
    )
    assert plan.provenance is not None
    assert plan.provenance.author == "model:tiny"
    run = asyncio.create_task(agent.submit_plan(plan))
    await _until(agent, "model-made", PlanStatus.BLOCKED)
    assert book.entries == []
    await agent.decide_gate("model-made", "one", approve=True, approver="ana", rationale="ok")
    assert (await run).status is PlanStatus.SUCCEEDED
    assert book.entries == [("model-made one", 11)]


async def test_a_fork_over_control_runs_on_from_its_fork_point(store: SqliteStateStore) -> None:
    book = Book()
    agent = _agent(store, book, Policy.from_toml(POLICY.split("[[approval]]")[0]))
    chain = Plan(
        id="chain",
        owner="perception",
        goal="three amounts",
        steps=[
            ToolStep(id="a", tool="record", input={"amount": 1}),
            ToolStep(id="b", tool="record", input={"amount": 2}, depends_on=["a"]),
            ToolStep(
                id="c", tool="record", input={"amount": ref("b.result.amount")}, depends_on=["b"]
            ),
        ],
    )
    assert (await agent.submit_plan(chain)).status is PlanStatus.SUCCEEDED
    fork = ControlRequest(plan_id="chain", action="fork", at_step="c", new_plan_id="chain-2")
    with pytest.raises(InvalidArgumentError) as info:
        await agent.control(fork.model_copy(update={"at_step": "zz"}), _ctx("operator", "fork"))
    assert info.value.violations[0].field == "at_step"
    with pytest.raises(InvalidArgumentError) as info:
        await agent.control(
            fork.model_copy(update={"set_json": '{"c": {"amount": 9}}'}), _ctx("operator", "fork")
        )
    assert info.value.violations[0].field == "set.c"
    # A substituted output must fit the tool's output model (before: taken, and failed later).
    with pytest.raises(InvalidArgumentError) as info:
        await agent.control(
            fork.model_copy(update={"set_json": '{"b": {"result": {"amount": "seven"}}}'}),
            _ctx("operator", "fork"),
        )
    (violation,) = info.value.violations
    assert violation.field == "set.b"
    assert violation.description.startswith(
        "the output does not fit step 'b''s output: result.amount: Input should be a valid integer"
    )
    assert await store.load("chain-2") is None  # nothing applied
    snapshot = await agent.control(
        fork.model_copy(update={"set_json": '{"b": {"result": {"amount": 7}}}'}),
        _ctx("operator", "fork"),
    )
    assert snapshot.plan_id == "chain-2"
    await _until(agent, "chain-2", PlanStatus.SUCCEEDED)
    assert book.entries == [("chain a", 1), ("chain b", 2), ("chain c", 2), ("chain-2 c", 7)]
    forked_from = json.loads(agent.plans("chain-2")[0].plan_json)["forked_from"]
    assert forked_from["plan_id"] == "chain"
    assert forked_from["author"] == "operator"
    assert forked_from["substituted"] == ["b"]
    report = await agent.replay("chain-2")
    assert report.divergences == []


def test_the_policys_roles_gates_and_approvals() -> None:
    policy = Policy.from_toml(POLICY)
    assert policy.roles == {"leads": frozenset({"ana", "bo"})}
    assert policy.gate_deciders("perception") == ("role:leads",)
    assert policy.gate_deciders("tactical") == ()
    assert policy.may_decide("bo", (), "perception")
    assert not policy.may_decide("operator", (), "perception")
    assert policy.may_decide("operator", (), "tactical")
    assert policy.may_decide("cy", ("cy",), "perception")
    assert [(r.tool, r.when, r.deciders) for r in policy.approvals("perception")] == [
        ("record", "arguments.amount > `10`", ("ana",))
    ]
    assert policy.approvals("tactical") == ()
    with pytest.raises(ProtocolUsageError, match="'role:nobody' names no role of"):
        Policy.from_toml(POLICY.replace("role:leads", "role:nobody"))
    with pytest.raises(ProtocolUsageError, match="escalates but names no one"):
        Policy.from_toml(POLICY + "escalate_after_s = 5\n")


def test_an_approval_whose_condition_does_not_parse_is_refused(store: SqliteStateStore) -> None:
    bad = Policy.from_toml(POLICY.replace("arguments.amount > `10`", "arguments.amount >"))
    with pytest.raises(ValueError, match="approval of tool 'record': invalid when"):
        _agent(store, Book(), bad)
