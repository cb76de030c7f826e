"""The Agent base: planning, validation, failure mapping, plan records, watch and the card."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from stratagem.agents import (
    Agent,
    PerceptionAgent,
    StrategicAgent,
    StrategicPlan,
    StrategicPlanner,
    ToolRegistry,
    research,
    tool,
)
from stratagem.planning import (
    LogicError,
    PlanResult,
    PlanStatus,
    PolicyError,
    RetryPolicy,
    ToolStep,
    TransientError,
)
from stratagem.protocol import (
    AgentBackend,
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    CallContext,
    CancelledError,
    ControlRequest,
    DeadlineExceededError,
    ExtractEntitiesRequest,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PlanEvent,
    RemoteError,
    SubmitGoalRequest,
    UnavailableError,
    WireModel,
)
from tests.unit.agents.conftest import call

TEXT = "Mira waits in the courtyard. Mira wants the crown."


@tool
async def fail_with(kind: str) -> AnalyzeNarrativeResponse:
    """Fail in the way asked for."""
    if kind == "logic":
        raise LogicError("the story makes no sense")
    if kind == "policy":
        raise PolicyError("stories about crowns are forbidden")
    if kind == "transient":
        raise TransientError("the muse is busy")
    if kind == "timeout":
        await asyncio.sleep(5)
    if kind == "cancel":
        raise asyncio.CancelledError
    return AnalyzeNarrativeResponse(protagonist="mira")


class ScriptedPlanner:
    """Plans AnalyzeNarrative as one step; the request text picks the tool and its input."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> StrategicPlan:
        assert isinstance(request, AnalyzeNarrativeRequest)
        tool_name, _, kind = request.text.partition(":")
        return StrategicPlan(
            id=plan_id,
            owner="strategic",
            goal="scripted",
            steps=[
                ToolStep(
                    id="only",
                    tool=tool_name,
                    input={"kind": kind},
                    timeout_s=0.05,
                    retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0),
                )
            ],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        return AnalyzeNarrativeResponse.model_validate(result.outputs["only"])


def scripted(max_records: int = 1000) -> Agent:
    registry = ToolRegistry("strategic")
    registry.register(fail_with)
    return Agent("strategic", registry, StrategicPlan, ScriptedPlanner(), max_records=max_records)


async def analyze(agent: Agent, text: str, **ids: str) -> WireModel:
    return await agent.handle(
        "AnalyzeNarrative",
        AnalyzeNarrativeRequest(text=text),
        call("AnalyzeNarrative", agent.role, **ids),
    )


async def test_an_agent_is_an_agent_backend() -> None:
    backend: AgentBackend = StrategicAgent()
    assert backend.role == "strategic"


def test_card_lists_capabilities_with_schemas_and_tools() -> None:
    card = PerceptionAgent().card()
    assert card.role == "perception"
    assert card.version
    assert [c.name for c in card.capabilities] == [
        "ExtractEntities",
        "FindSpatialContext",
        "UpdateWorldState",
        "ListWorlds",
        "ShowWorld",
        "ResetWorld",
    ]
    schema = json.loads(card.capabilities[0].request_schema)
    assert schema["properties"]["text"]["maxLength"] == 20_000
    assert card.tools == [
        "split_sentences",
        "match_patterns",
        "resolve_entities",
        "merge_world",
        "locate_entities",
        "world_facts",
        "check_actions",
        "apply_actions",
        "list_worlds",
        "show_world",
        "reset_world",
        *research.RESEARCH_TOOLS,
    ]


async def test_unknown_capability_is_not_found() -> None:
    with pytest.raises(NotFoundError, match="the strategic agent does not serve 'ExtractEntities'"):
        await StrategicAgent().handle(
            "ExtractEntities",
            ExtractEntitiesRequest(text=TEXT),
            call("ExtractEntities", "strategic"),
        )


async def test_a_request_of_the_wrong_model_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await StrategicAgent().handle(
            "PlanNarrativeArc",
            AnalyzeNarrativeRequest(text=TEXT),
            call("PlanNarrativeArc", "strategic"),
        )
    assert {v.field for v in info.value.violations} >= {"goal", "protagonist", "text"}


async def test_plan_ids_come_from_the_caller_then_the_request_then_chance() -> None:
    agent = StrategicAgent()
    await analyze(agent, TEXT, plan_id="goal-1", step_id="analyze")
    await analyze(agent, TEXT)
    ids = [s.plan_id for s in agent.plans("")]
    assert ids[0] == "goal-1/analyze"
    assert re.fullmatch(r"strategic-[0-9a-f]{12}", ids[1])


async def test_the_same_plan_id_again_is_a_new_revision() -> None:
    agent = StrategicAgent()
    await analyze(agent, TEXT, plan_id="goal-1", step_id="analyze")
    await analyze(agent, TEXT, plan_id="goal-1", step_id="analyze")
    [snapshot] = agent.plans("goal-1")
    assert snapshot.revision == 2
    assert [e.revision for e in agent.record("goal-1/analyze").events if not e.step_id] == [
        1,
        1,
        2,
        2,
    ]


async def test_a_plan_naming_another_agents_tool_is_refused() -> None:
    agent = StrategicAgent()
    plan = StrategicPlan(
        id="sneaky",
        owner="strategic",
        goal="change the world from the wrong agent",
        steps=[ToolStep(id="apply", tool="apply_actions", input={"actions": []})],
    )
    # A user's plan that does not validate is bad input (INVALID_ARGUMENT over the wire).
    with pytest.raises(InvalidArgumentError) as info:
        await agent.submit_plan(plan)
    assert info.value.message == (
        "plan 'sneaky' refused: step 'apply' uses tool 'apply_actions', which is not in the "
        "strategic agent's registry"
    )
    [snapshot] = agent.plans("sneaky")
    assert snapshot.status == "failed"
    events = [e async for e in agent.watch("sneaky")]
    assert [(e.step_id, e.status) for e in events] == [("", "failed")]


async def test_a_planner_that_names_a_foreign_tool_is_refused_too() -> None:
    with pytest.raises(
        FailedPreconditionError,
        match="uses tool 'merge_world', which is not in the strategic agent's registry",
    ):
        await analyze(scripted(), "merge_world:")


async def test_plans_owned_by_another_role_or_of_another_type_are_refused() -> None:
    agent = StrategicAgent()
    with pytest.raises(InvalidArgumentError, match="owned by 'tactical'"):
        await agent.submit_plan({"id": "p", "owner": "tactical", "goal": "g"})
    with pytest.raises(InvalidArgumentError) as info:
        await agent.submit_plan({"id": "p", "owner": "strategic"})
    assert [v.field for v in info.value.violations] == ["goal"]


async def test_a_users_plan_may_not_pass_for_a_sub_plan() -> None:
    # A sub-plan's id is PLAN/STEP: before, a user's plan 'mine/x' ran and was listed as a
    # sub-plan of 'mine'.
    agent = StrategicAgent()
    await agent.submit_plan(
        {
            "id": "mine",
            "owner": "strategic",
            "goal": "how tense is it?",
            "steps": [
                {"kind": "tool", "id": "t", "tool": "measure_tension", "input": {"text": TEXT}}
            ],
        }
    )
    with pytest.raises(InvalidArgumentError) as info:
        await agent.submit_plan({"id": "mine/x", "owner": "strategic", "goal": "impersonate"})
    assert info.value.message == (
        "plan 'mine/x' refused: its id has a '/', which marks a sub-plan's id (PLAN/STEP): name "
        "it without one"
    )
    assert [snapshot.plan_id for snapshot in agent.plans("mine")] == ["mine"]
    # Nor may a goal or a fork be named so, on the wire.
    with pytest.raises(ValidationError, match=r"plan_id\n.*a '/' marks a sub-plan's id"):
        SubmitGoalRequest(goal="g", passage="p.", plan_id="mine/x")
    with pytest.raises(ValidationError, match=r"new_plan_id\n.*a '/' marks a sub-plan's id"):
        ControlRequest(plan_id="mine", action="fork", new_plan_id="mine/x")
    assert SubmitGoalRequest(goal="g", passage="p.", plan_id="mine-2").plan_id == "mine-2"


async def test_submit_plan_runs_a_users_plan() -> None:
    agent = StrategicAgent()
    result = await agent.submit_plan(
        {
            "id": "mine",
            "owner": "strategic",
            "goal": "how tense is it?",
            "steps": [
                {"kind": "tool", "id": "t", "tool": "measure_tension", "input": {"text": TEXT}}
            ],
        }
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert 0.0 <= result.outputs["t"]["tension"] <= 1.0
    assert agent.plans("mine")[0].status == "succeeded"


@pytest.mark.parametrize(
    ("kind", "error", "fragment"),
    [
        ("logic", FailedPreconditionError, "(logic): the story makes no sense"),
        ("policy", PermissionDeniedError, "(policy): stories about crowns are forbidden"),
        ("transient", UnavailableError, "(transient): the muse is busy"),
        ("timeout", DeadlineExceededError, "(timeout): timed out after 0.05s"),
        ("cancel", CancelledError, "(cancelled)"),
    ],
)
async def test_failure_classes_map_to_status_codes(
    kind: str, error: type[RemoteError], fragment: str
) -> None:
    with pytest.raises(error) as info:
        await analyze(scripted(), f"fail_with:{kind}", plan_id="g", step_id="s")
    assert type(info.value) is error
    assert info.value.message.startswith("plan 'g/s' step 'only' failed ")
    assert fragment in info.value.message
    assert "\n" not in info.value.message


async def test_success_responds_through_the_planner() -> None:
    answer = await analyze(scripted(), "fail_with:none")
    assert answer == AnalyzeNarrativeResponse(protagonist="mira")


async def test_records_are_bounded() -> None:
    agent = scripted(max_records=3)
    for i in range(5):
        await analyze(agent, "fail_with:none", plan_id=f"g{i}", step_id="s")
    assert [s.plan_id for s in agent.plans("")] == ["g2/s", "g3/s", "g4/s"]
    with pytest.raises(NotFoundError):
        agent.record("g0/s")


async def test_watch_replays_then_follows_live_until_the_plan_ends() -> None:
    agent = StrategicAgent()
    await analyze(agent, TEXT, plan_id="goal", step_id="first")
    events: list[PlanEvent] = []

    async def consume() -> None:
        async for event in agent.watch("goal/second"):
            events.append(event)

    watcher = asyncio.create_task(consume())
    await asyncio.sleep(0)
    await analyze(agent, TEXT, plan_id="goal", step_id="second")
    await asyncio.wait_for(watcher, 1)
    assert {e.plan_id for e in events} == {"goal/second"}
    assert (events[0].step_id, events[0].status) == ("", "running")
    assert (events[-1].step_id, events[-1].status) == ("", "succeeded")
    assert {e.step_id for e in events} == {"", "protagonist", "themes", "tension", "summary"}
    assert all(e.agent == "strategic" for e in events)

    # A finished plan replays and ends at once.
    replay = [e async for e in agent.watch("goal/first")]
    assert replay[-1].status == "succeeded"


async def test_watching_a_parent_plan_not_on_this_agent_streams_its_sub_plans() -> None:
    agent = StrategicAgent()
    await analyze(agent, TEXT, plan_id="goal", step_id="a")
    seen: list[PlanEvent] = []

    async def consume() -> None:
        async for event in agent.watch("goal"):
            seen.append(event)

    watcher = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    # Replayed: the sub-plan "goal/a" from start to end.
    assert (seen[0].plan_id, seen[0].status) == ("goal/a", "running")
    assert (seen[-1].plan_id, seen[-1].step_id, seen[-1].status) == ("goal/a", "", "succeeded")
    # The plan "goal" itself is not this agent's: the stream goes on instead of ending.
    assert not watcher.done()
    await analyze(agent, TEXT, plan_id="other", step_id="x")
    await analyze(agent, TEXT, plan_id="goal", step_id="b")
    await asyncio.sleep(0.05)
    assert {e.plan_id for e in seen} == {"goal/a", "goal/b"}
    assert not watcher.done()
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    assert {s.plan_id for s in agent.plans("goal")} == {"goal/a", "goal/b"}


async def test_snapshots_carry_the_typed_plan_with_step_statuses() -> None:
    agent = StrategicAgent()
    await analyze(agent, TEXT, plan_id="goal", step_id="a")
    [snapshot] = agent.plans("goal/a")
    assert (snapshot.agent, snapshot.status, snapshot.revision) == ("strategic", "succeeded", 1)
    plan = StrategicPlan.model_validate_json(snapshot.plan_json)
    assert {s.status for s in plan.steps} == {"succeeded"}
    assert "dramatic_beats" in json.loads(snapshot.plan_json)


def test_add_capability_checks_role_and_registration() -> None:
    from stratagem.protocol import CAPABILITIES

    agent = StrategicAgent()
    with pytest.raises(ValueError, match="served by perception, not strategic"):
        agent.add_capability(CAPABILITIES["ExtractEntities"], StrategicPlanner())
    agent.add_capability(CAPABILITIES["AnalyzeNarrative"], StrategicPlanner())  # same spec: fine


async def test_run_plan_runs_a_users_plan_and_refuses_a_cycle_or_bad_json() -> None:
    agent = StrategicAgent()
    ctx = CallContext(caller="operator", target="strategic", capability="RunPlan", request_id="r")
    good = {
        "id": "user-analysis",
        "owner": "strategic",
        "goal": "find the protagonist",
        "steps": [
            {
                "kind": "tool",
                "id": "who",
                "tool": "find_protagonist",
                "input": {"text": "Mira waits in the hall. Mira has the key.", "entities": []},
            }
        ],
    }
    snapshot = await agent.run_plan(json.dumps(good), ctx)
    assert (snapshot.plan_id, snapshot.agent, snapshot.status) == (
        "user-analysis",
        "strategic",
        "succeeded",
    )
    assert json.loads(snapshot.plan_json)["steps"][0]["status"] == "succeeded"

    cyclic = dict(good, id="loop")
    cyclic["steps"] = [
        dict(good["steps"][0], id="a", depends_on=["b"]),
        dict(good["steps"][0], id="b", depends_on=["a"]),
    ]
    with pytest.raises(InvalidArgumentError, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        await agent.run_plan(json.dumps(cyclic), ctx)
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        await agent.run_plan("{nope", ctx)
