"""Tool, the @tool decorator and ToolRegistry (the agents' planning.ToolRunner)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from pydantic import BaseModel, model_validator

from stratagem.agents import Tool, ToolRegistry, tool
from stratagem.agents._mcp import json_schema_model
from stratagem.agents._tool import validates_off_loop
from stratagem.planning import (
    Budget,
    Engine,
    FailureClass,
    LogicError,
    Plan,
    PlanStatus,
    StepFailure,
    StepStatus,
    ToolContext,
    ToolStep,
)

CTX = ToolContext(plan_id="p", step_id="s", attempt=1, agent="strategic")


class Greeting(BaseModel):
    name: str
    times: int = 1


class Greeted(BaseModel):
    text: str


@tool(side_effects=False, cost=2.0)
async def greet(data: Greeting, ctx: ToolContext) -> Greeted:
    """Greet someone a number of times."""
    return Greeted(text=" ".join([f"hello {data.name} from {ctx.step_id}"] * data.times))


@tool
async def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


@tool(name="bad_output")
async def returns_wrong_shape(n: int) -> Greeted:
    """Claims to return Greeted but does not."""
    return {"wrong": n}  # type: ignore[return-value]


def registry() -> ToolRegistry:
    reg = ToolRegistry("strategic")
    for item in (greet, add, returns_wrong_shape):
        reg.register(item)
    return reg


def test_decorator_takes_models_from_a_model_signature() -> None:
    assert isinstance(greet, Tool)
    assert greet.name == "greet"
    assert greet.description == "Greet someone a number of times."
    assert greet.input_model is Greeting
    assert greet.output_model is Greeted
    assert greet.cost == 2.0
    assert not greet.side_effects
    assert greet.idempotent


def test_decorator_derives_models_from_plain_parameters() -> None:
    assert set(add.input_model.model_fields) == {"a", "b"}
    assert add.input_model.model_fields["b"].default == 0
    assert set(add.output_model.model_fields) == {"result"}


def test_decorator_refuses_sync_and_unannotated_functions() -> None:
    def sync(a: int) -> int:
        return a

    async def untyped(a):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(TypeError, match="must be async"):
        tool(sync)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no annotation"):
        tool(untyped)


async def test_run_tool_validates_and_dumps() -> None:
    reg = registry()
    assert await reg.run_tool("greet", {"name": "Mira", "times": 2}, CTX) == {
        "text": "hello Mira from s hello Mira from s"
    }
    assert await reg.run_tool("add", {"a": 2, "b": 3}, CTX) == {"result": 5}


async def test_missing_field_is_a_logic_error_naming_the_field() -> None:
    with pytest.raises(
        LogicError, match=r"tool 'greet': invalid input: field 'name': Field required"
    ):
        await registry().run_tool("greet", {"times": 2}, CTX)


async def test_wrong_type_and_unknown_field_are_logic_errors() -> None:
    reg = registry()
    with pytest.raises(LogicError, match="field 'times'"):
        await reg.run_tool("greet", {"name": "Mira", "times": "many"}, CTX)
    with pytest.raises(LogicError, match="field 'c': Extra inputs are not permitted"):
        await reg.run_tool("add", {"a": 1, "c": 2}, CTX)


async def test_invalid_output_is_a_logic_error() -> None:
    with pytest.raises(LogicError, match="tool 'bad_output': invalid output"):
        await registry().run_tool("bad_output", {"n": 1}, CTX)


async def test_unknown_tool_is_a_logic_error_naming_agent_and_tools() -> None:
    with pytest.raises(LogicError, match=r"agent 'strategic' has no tool 'apply_actions'"):
        await registry().run_tool("apply_actions", {}, CTX)


def test_registry_collection_behaviour() -> None:
    reg = registry()
    assert reg.names() == ["greet", "add", "bad_output"]
    assert list(reg) == reg.names()
    assert len(reg) == 3
    assert "add" in reg
    assert "split_sentences" not in reg
    assert reg.get("add") is add
    with pytest.raises(KeyError, match="has no tool 'nope'"):
        reg.get("nope")


def test_duplicate_name_is_refused_unless_replacing() -> None:
    reg = registry()
    other = Tool(
        name="add",
        description="another add",
        input_model=Greeting,
        output_model=Greeted,
        fn=greet.fn,
    )
    with pytest.raises(ValueError, match="already has a tool named 'add'"):
        reg.register(other)
    reg.register(add)  # the same tool again is harmless
    reg.register(other, replace=True)
    assert reg.get("add") is other


def test_a_side_effecting_tool_is_not_idempotent_unless_it_says_so() -> None:
    async def charge(amount: int) -> int:
        """Charge an amount."""
        return amount

    plain = tool(charge)
    effect = tool(side_effects=True)(charge)
    declared = tool(side_effects=True, idempotent=True)(charge)
    pure_but_not_idempotent = tool(idempotent=False)(charge)
    assert plain.idempotent is True
    assert effect.idempotent is False
    assert declared.idempotent is True
    assert pure_but_not_idempotent.idempotent is False
    # The same default for a Tool built directly.
    direct = Tool(
        name="direct",
        description="d",
        input_model=effect.input_model,
        output_model=effect.output_model,
        fn=effect.fn,
        side_effects=True,
    )
    assert direct.idempotent is False
    # The engine asks the registry: only the declared one is re-run after a crash.
    reg = ToolRegistry("strategic")
    for name, item in (("a", plain), ("b", effect), ("c", declared)):
        reg.register(dataclasses.replace(item, name=name))
    assert [reg.is_idempotent(name) for name in ("a", "b", "c", "unknown")] == [
        True,
        False,
        True,
        False,
    ]


def test_registry_reports_each_tools_cost_and_idempotency() -> None:
    reg = registry()
    assert reg.cost("greet") == 2.0
    assert reg.cost("add") == 1.0
    assert reg.cost("unknown") == 1.0
    assert reg.is_idempotent("greet")
    assert not reg.is_idempotent("unknown")


async def test_a_tools_cost_is_reserved_from_the_plans_budget() -> None:
    # greet costs 2.0: the first call reserves 2 of the 3 units, the second cannot start.
    engine = Engine(tools=registry(), agent="strategic")
    steps = [
        ToolStep(id="a", tool="greet", input={"name": "ada"}),
        ToolStep(id="b", tool="greet", input={"name": "bob"}, depends_on=["a"]),
    ]
    plan = Plan(id="p", owner="strategic", goal="g", steps=steps, budget=Budget(cost_units=3))
    result = await engine.run(plan)
    assert result.status is PlanStatus.FAILED
    assert result.statuses == {"a": StepStatus.SUCCEEDED, "b": StepStatus.FAILED}
    assert result.failures == [
        StepFailure(
            "b",
            FailureClass.POLICY,
            "budget exhausted: cost_units 2/3 used; step 'b' needs 2 more",
            0,
        )
    ]


_validated_on: list[int] = []  # threads that validated a Traced or Foreign


class Traced(BaseModel):
    """A plain model that notes the thread it was validated on."""

    name: str

    @model_validator(mode="after")
    def _note(self) -> Traced:
        _validated_on.append(threading.get_ident())
        return self


class Foreign(json_schema_model("ForeignInput", {"type": "object"})):  # type: ignore[misc]
    """A model applying a foreign JSON Schema that notes the thread it was validated on."""

    @model_validator(mode="after")
    def _note(self) -> Foreign:
        _validated_on.append(threading.get_ident())
        return self


class Wrapping(BaseModel):
    """A plain model holding foreign ones in a field."""

    items: list[Foreign] = []


@tool
async def plain(data: Traced) -> Greeted:
    """A tool whose models pydantic checks on its own."""
    return Greeted(text=data.name)


@tool
async def foreign(data: Foreign) -> Greeted:
    """A tool whose input applies a foreign JSON Schema."""
    return Greeted(text="ok")


@tool
async def wrapping(data: Wrapping) -> Greeted:
    """A tool with a foreign model in a field of its input."""
    return Greeted(text="ok")


async def test_plain_models_validate_on_the_loop_and_foreign_schemas_in_a_thread() -> None:
    # A thread hop per step costs more than pydantic's own checks (agent.handle 2.5 ms -> 0.33 ms
    # under load, BENCHMARKS.md); only a foreign schema's check, bounded by seconds, needs one.
    reg = ToolRegistry("strategic")
    for item in (plain, foreign, wrapping):
        reg.register(item)
    loop_thread = threading.get_ident()
    _validated_on.clear()
    assert await reg.run_tool("plain", {"name": "mira"}, CTX) == {"text": "mira"}
    assert _validated_on == [loop_thread]
    for name, data in (("foreign", {"a": 1}), ("wrapping", {"items": [{"a": 1}]})):
        _validated_on.clear()
        assert await reg.run_tool(name, data, CTX) == {"text": "ok"}
        assert _validated_on, name
        assert loop_thread not in _validated_on, name
    assert validates_off_loop(Wrapping)
    assert not validates_off_loop(Traced)


async def test_a_replaced_tool_is_judged_by_its_new_models() -> None:
    reg = ToolRegistry("strategic")
    reg.register(dataclasses.replace(foreign, name="swap"))
    reg.register(dataclasses.replace(plain, name="swap"), replace=True)
    _validated_on.clear()
    await reg.run_tool("swap", {"name": "x"}, CTX)
    assert _validated_on == [threading.get_ident()]
