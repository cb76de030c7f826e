"""Agents of one's own: the critic example in memory, and every way a definition is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratagem.agents import (
    ROLE_TYPES,
    Agent,
    AgentDefinitionError,
    AgentSpec,
    ExtensionError,
    RoleAgent,
    StrategicPlan,
    build_agent,
    build_in_memory,
    define_agent,
    defined_agents,
    extension_policy_rules,
    import_extensions,
    tool,
)
from stratagem.agents._definition import defined_agent_type
from stratagem.planning import (
    GateStep,
    Plan,
    PlanResult,
    PlanStatus,
    SqliteStateStore,
    ToolStep,
)
from stratagem.protocol import (
    CAPABILITIES,
    EXTENSION_FIELD,
    CapabilitySpec,
    InvalidArgumentError,
    Policy,
    WireModel,
    roles,
)
from tests.unit.agents.conftest import EXAMPLES, REPO, call

pytestmark = pytest.mark.usefixtures("clean_registry")

CRITIC = "examples.extensions.critic"
BUILT_IN = ("strategic", "tactical", "perception", "orchestrator")


@pytest.fixture(autouse=True)
def _from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _plan(**fields: Any) -> dict[str, Any]:
    return {"id": "p", "owner": "strategic", "goal": "g", **fields}


async def review(agent: RoleAgent, **request: Any) -> dict[str, Any]:
    spec = CAPABILITIES["ReviewPlan"]
    answer = await agent.handle(
        "ReviewPlan", spec.request.model_validate(request), call("ReviewPlan", "critic")
    )
    return answer.model_dump(mode="json")


# --- the critic ------------------------------------------------------------------------------


async def test_the_critic_is_a_fifth_agent_built_like_the_four() -> None:
    agents, _ = build_in_memory(extensions=[CRITIC], entry_points=False)
    assert list(agents) == [*BUILT_IN, "critic"]
    assert roles() == (*BUILT_IN, "critic")
    critic = agents["critic"]
    assert isinstance(critic, RoleAgent)
    assert type(critic) is Agent  # a defined role is data too: no class of its own
    spec = defined_agents()["critic"]
    assert isinstance(spec, AgentSpec)
    critic_role = defined_agent_type("critic")
    assert critic_role is not None
    assert critic_role.spec is spec
    assert isinstance(critic, critic_role)
    assert not isinstance(agents["strategic"], critic_role)
    assert critic.plan_type is spec.plan_type
    assert spec.plan_type.__name__ == "CriticPlan"
    card = critic.card()
    assert card.role == "critic"
    assert [c.name for c in card.capabilities] == ["ReviewPlan"]
    assert card.tools == ["outline_plan", "check_rules", "assess_risks", "weigh_findings"]
    # The built-in four are as they were.
    assert all(
        agents[role].registry.names() == ROLE_TYPES[role]().registry.names() for role in BUILT_IN
    )


async def test_a_plan_using_another_agents_tool_is_unsound() -> None:
    agents, _ = build_in_memory(["critic"], extensions=[CRITIC], entry_points=False)
    steps = [
        {"kind": "tool", "id": "a", "tool": "score_themes", "input": {"text": "Mira waits."}},
        {"kind": "tool", "id": "b", "tool": "match_patterns", "depends_on": ["a"], "input": {}},
    ]
    answer = await review(agents["critic"], plan=_plan(steps=steps))
    assert answer["verdict"] == "unsound"
    assert (answer["plan_id"], answer["owner"], answer["steps"]) == ("p", "strategic", 2)
    assert (answer["depth"], answer["width"]) == (2, 1)
    [foreign] = [f for f in answer["findings"] if f["step"] == "b"]
    assert foreign["severity"] == "error"
    assert "'match_patterns', the perception agent's" in foreign["message"]
    # Errors come first.
    assert answer["findings"][0]["severity"] == "error"


async def test_a_cycle_and_a_reference_outside_the_dependencies_are_found() -> None:
    agents, _ = build_in_memory(["critic"], extensions=[CRITIC], entry_points=False)
    steps = [
        {"kind": "tool", "id": "a", "tool": "score_themes", "depends_on": ["b"], "input": {}},
        {"kind": "tool", "id": "b", "tool": "score_themes", "depends_on": ["a"], "input": {}},
        {"kind": "tool", "id": "c", "tool": "score_themes", "input": {"x": {"$ref": "a.x"}}},
    ]
    answer = await review(agents["critic"], plan_json=json.dumps(_plan(steps=steps)))
    messages = " | ".join(f["message"] for f in answer["findings"])
    assert answer["verdict"] == "unsound"
    assert "cycle" in messages
    assert "not among its (transitive) dependencies" in messages
    assert (answer["depth"], answer["width"]) == (0, 0)


async def test_a_budgeted_one_step_plan_is_sound_and_no_plan_is_unsound() -> None:
    agents, _ = build_in_memory(["critic"], extensions=[CRITIC], entry_points=False)
    step = {"kind": "tool", "id": "a", "tool": "score_themes", "input": {"text": "Mira."}}
    sound = await review(agents["critic"], plan=_plan(steps=[step], budget={"tool_calls": 3}))
    assert (sound["verdict"], sound["findings"]) == ("sound", [])
    broken = await review(agents["critic"], plan={"id": "p", "steps": "none"})
    assert broken["verdict"] == "unsound"
    assert {f["message"].split(":")[0] for f in broken["findings"]} == {"not a plan"}


def test_the_request_takes_the_plan_once() -> None:
    import_extensions([CRITIC])
    model = CAPABILITIES["ReviewPlan"].request
    wrongs = {
        "not both or neither": {},
        "not both": {"plan": {}, "plan_json": "{}"},
        "not a JSON object": {"plan_json": "[1]"},
        "not valid JSON": {"plan_json": "{"},
    }
    for fragment, wrong in wrongs.items():
        with pytest.raises(ValueError, match=fragment):
            model.model_validate(wrong)


async def test_the_orchestrator_reaches_the_critic_through_a_cross_agent_step() -> None:
    agents, _ = build_in_memory(extensions=[CRITIC], entry_points=False)
    raw = yaml.safe_load((EXAMPLES / "plans" / "critic-review.yaml").read_text(encoding="utf-8"))
    result = await agents["orchestrator"].submit_plan(raw)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["review"]["plan_id"] == "who-leads"
    assert result.outputs["review"]["verdict"] == "concerns"  # no budget
    assert result.outputs["analyze"]["protagonist"] == "mira"
    [sub] = agents["critic"].plans("critic-review/review")
    assert (sub.agent, sub.status) == ("critic", "succeeded")


async def test_the_critic_plan_type_admits_only_the_critics_tools() -> None:
    critic = build_agent("critic", extensions=[CRITIC], entry_points=False)
    plan = critic.plan_type(
        id="mine",
        owner="critic",
        goal="borrow a tool",
        steps=[ToolStep(id="a", tool="score_themes", input={"text": "x"})],
    )
    with pytest.raises(InvalidArgumentError, match="not in the critic agent's registry"):
        await critic.submit_plan(plan)


async def _until(agent: Agent, plan_id: str, status: PlanStatus) -> None:
    """Wait for the plan's own event of ``status`` (stored ones count)."""
    async for event in agent.watch(plan_id):
        if event.plan_id == plan_id and not event.step_id and event.status == status.value:
            return


async def test_a_restarted_critic_resumes_its_plan_from_its_store(tmp_path: Path) -> None:
    path = tmp_path / "critic.plans.sqlite3"
    reviewed = json.dumps(_plan(steps=[]))
    steps = [
        GateStep(id="ask", prompt="Review it?"),
        ToolStep(
            id="outline", tool="outline_plan", depends_on=["ask"], input={"plan_json": reviewed}
        ),
    ]
    async with SqliteStateStore(path) as first:
        critic = build_agent("critic", extensions=[CRITIC], entry_points=False, store=first)
        plan = critic.plan_type(id="held", owner="critic", goal="wait", steps=steps, reviewed="p")
        run = asyncio.create_task(critic.submit_plan(plan))
        await _until(critic, "held", PlanStatus.BLOCKED)
        run.cancel()  # the critic's process dies while its plan waits
        with pytest.raises(asyncio.CancelledError):
            await run
    async with SqliteStateStore(path) as second:
        restarted = build_agent("critic", extensions=[CRITIC], entry_points=False, store=second)
        assert await restarted.resume_unfinished() == ["held"]
        await _until(restarted, "held", PlanStatus.BLOCKED)
        await restarted.decide_gate("held", "ask", approve=True, approver="op", rationale="go")
        await _until(restarted, "held", PlanStatus.SUCCEEDED)
        state = await second.load("held")
        assert state is not None
        # Read back as the critic's own plan type, with its own field.
        assert state.plan(restarted.plan_type).model_dump()["reviewed"] == "p"
        assert state.outputs["outline"]["plan_id"] == "p"
        await restarted.aclose()


def test_the_critics_policy_entries_grant_exactly_what_it_declares() -> None:
    import_extensions([CRITIC])
    policy = Policy([*Policy.default().rules, *extension_policy_rules()])
    assert policy.allows("orchestrator", "critic", "ReviewPlan")
    assert policy.allows("orchestrator", "critic", "Describe")
    assert policy.allows("critic", "strategic", "Describe")
    assert policy.allows("operator", "critic", "ReviewPlan")  # the default policy's rule
    assert not policy.allows("strategic", "critic", "ReviewPlan")
    assert not policy.allows("critic", "perception", "ExtractEntities")
    assert not policy.allows("orchestrator", "critic", "RunPlan")
    assert not Policy.default().allows("orchestrator", "critic", "ReviewPlan")


async def test_an_async_planner_is_awaited() -> None:
    @tool
    async def echo_text(text: str) -> str:
        """Echo."""
        return text

    class EchoPlan(Plan):
        pass

    class Echo(WireModel):
        text: str

    class AsyncPlanner:
        async def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
            await asyncio.sleep(0)
            assert isinstance(request, Echo)
            step = ToolStep(id="e", tool="echo_text", input={"text": request.text})
            return EchoPlan(id=plan_id, owner="echoer", goal="echo", steps=[step])

        def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> Echo:
            return Echo(text=result.outputs["e"]["result"])

    echo = CapabilitySpec("Echo", "echoer", EXTENSION_FIELD, Echo, Echo)
    define_agent(
        "echoer",
        plan_type=EchoPlan,
        planner=AsyncPlanner,
        tools=[echo_text],
        capabilities=[echo],
        callers={"*": ["Echo"]},
    )
    agent = build_agent("echoer", entry_points=False)
    answer = await agent.handle("Echo", Echo(text="hi"), call("Echo", "echoer"))
    assert answer == Echo(text="hi")
    assert Policy(extension_policy_rules()).allows("anyone", "echoer", "Echo")


def test_an_unknown_role_is_refused_naming_the_defined_ones() -> None:
    import_extensions([CRITIC])
    with pytest.raises(ValueError, match=r"unknown role 'narrator'; roles are: .*, critic$"):
        build_agent("narrator", entry_points=False)


# --- definitions refused ------------------------------------------------------------------------


class _Planner:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise NotImplementedError

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        raise NotImplementedError


class _NoRespond:
    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        raise NotImplementedError


class _AsyncRespond(_Planner):
    async def respond(  # type: ignore[override]
        self, capability: str, request: WireModel, result: PlanResult[Any]
    ) -> WireModel:
        raise NotImplementedError


class _GeneratorPlan(_Planner):
    async def plan(  # type: ignore[override]
        self, capability: str, request: WireModel, *, plan_id: str
    ) -> AsyncIterator[Plan]:
        yield Plan(id=plan_id, owner="x", goal="g")


class _NoPlanId(_Planner):
    def plan(self, capability: str, request: WireModel) -> Plan:  # type: ignore[override]
        raise NotImplementedError


class _Request(WireModel):
    text: str = ""


class SoloPlan(Plan):
    """A plan type for the refused definitions."""


@tool
async def solo_tool(text: str) -> str:
    """A tool of its own."""
    return text


@tool(name="score_themes")
async def borrowed(text: str) -> str:
    """A tool named like the strategic agent's."""
    return text


def _capability(name: str = "Solo", role: str = "solo") -> CapabilitySpec:
    return CapabilitySpec(name, role, EXTENSION_FIELD, _Request, _Request)


def _definition(**changes: Any) -> dict[str, Any]:
    return {
        "role": "solo",
        "plan_type": SoloPlan,
        "planner": _Planner,
        "tools": [solo_tool],
        "capabilities": [_capability()],
        "callers": {"orchestrator": ["Solo"]},
        **changes,
    }


REFUSED = {
    "duplicate-built-in": ({"role": "strategic"}, "the role is a built-in agent's"),
    "not-an-identifier": ({"role": "Solo-Agent!"}, "is not a lowercase identifier"),
    "the-operator": ({"role": "operator"}, "the operator's identity"),
    "another-agents-tool": (
        {"tools": [solo_tool, borrowed]},
        "'score_themes', which is the strategic agent's",
    ),
    "two-tools-one-name": (
        {"tools": [solo_tool, solo_tool]},
        "two of its tools are named 'solo_tool'",
    ),
    "not-a-tool": ({"tools": [print]}, "is not a Tool"),
    "plan-type-of-another": ({"plan_type": StrategicPlan}, "is the strategic agent's"),
    "plan-type-plan": ({"plan_type": Plan}, "a Plan subclass of its own"),
    "plan-type-not-a-plan": ({"plan_type": dict}, "is not a planning.Plan subclass"),
    "no-policy-entry": ({"callers": {}}, "capability 'Solo' has no policy entry"),
    "policy-for-another-capability": (
        {"callers": {"orchestrator": ["Solo", "Sol"]}},
        "callers['orchestrator'] names 'Sol', which the solo agent does not serve",
    ),
    "policy-bad-caller": ({"callers": {"Bad Caller": ["Solo"]}}, "is not an identity"),
    "calls-a-capability-its-target-lacks": (
        {"calls": {"perception": ["PlanNarrativeArc"]}},
        "which the perception agent does not serve",
    ),
    "calls-itself": ({"calls": {"solo": ["Solo"]}}, "calls names the agent itself"),
    "policy-a-string": ({"callers": {"orchestrator": "Solo"}}, "must be a list of capability"),
    "planner-no-respond": ({"planner": _NoRespond}, "has no respond(capability, request, result)"),
    "planner-async-respond": ({"planner": _AsyncRespond}, "respond is async"),
    "planner-generator": ({"planner": _GeneratorPlan}, "plan is a generator"),
    "planner-signature": ({"planner": _NoPlanId}, "has no plan(capability, request, *, plan_id)"),
    "planner-instance": ({"planner": _Planner()}, "must be a class or function"),
    "capability-clash": (
        {"capabilities": [_capability("ExtractEntities")], "callers": {"*": ["*"]}},
        "capability 'ExtractEntities' clashes with the one the perception agent serves",
    ),
    "capability-of-another-role": (
        {"capabilities": [_capability(role="critic")]},
        "capability 'Solo' is for role 'critic', not 'solo'",
    ),
}


@pytest.mark.parametrize(("changes", "fragment"), REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_definition_is_refused_in_one_line_and_registers_nothing(
    changes: dict[str, Any], fragment: str
) -> None:
    before = (roles(), dict(CAPABILITIES), dict(defined_agents()))
    definition = _definition(**changes)
    role = definition.pop("role")
    with pytest.raises(AgentDefinitionError) as info:
        define_agent(role, **definition)
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"agent {info.value.role!r}: ")
    assert "\n" not in str(info.value)
    assert (roles(), dict(CAPABILITIES), dict(defined_agents())) == before


def test_a_role_defined_twice_is_refused() -> None:
    define_agent(**_definition())
    again = _definition(plan_type=type("OtherPlan", (Plan,), {}), tools=[], capabilities=[])
    with pytest.raises(AgentDefinitionError, match="'solo': the role is defined already"):
        define_agent(**again)


def test_a_tool_of_another_defined_agent_is_refused() -> None:
    define_agent(**_definition())
    other = _definition(role="other", plan_type=type("OtherPlan", (Plan,), {}), capabilities=[])
    with pytest.raises(AgentDefinitionError, match="'solo_tool', which is the solo agent's"):
        define_agent(**other)


@pytest.fixture
def bad_extension(tmp_path: Path) -> Path:
    path = tmp_path / "bad_critic.py"
    path.write_text(
        "from examples.extensions import critic\n"
        "from stratagem.agents import define_agent\n"
        "BAD = define_agent('critic', plan_type=critic.CriticPlan, planner=critic.CriticPlanner)\n",
        encoding="utf-8",
    )
    return path


def test_an_extension_defining_an_agent_badly_is_one_line_naming_it(bad_extension: Path) -> None:
    with pytest.raises(ExtensionError) as info:
        import_extensions([str(bad_extension)])
    assert str(info.value) == (
        f"extension {str(bad_extension)!r}: agent 'critic': the role is defined already "
        "(by another extension?)"
    )


def test_a_module_that_only_defines_an_agent_needs_no_setup_and_loads_once(tmp_path: Path) -> None:
    path = tmp_path / "solo_ext.py"
    path.write_text(
        "from tests.unit.agents.test_definition import _definition\n"
        "from stratagem.agents import define_agent\n"
        "SOLO = define_agent(**_definition())\n",
        encoding="utf-8",
    )
    import_extensions([str(path)])
    import_extensions([str(path)])  # imported once: not a second definition
    agent = build_agent("solo", extensions=[str(path)], entry_points=False)
    assert agent.registry.names() == ["solo_tool"]
    assert list(defined_agents()) == ["solo"]
