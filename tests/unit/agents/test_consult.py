"""Goals that consult external A2A agents: the planners' steps, the refusal of an unknown agent,
what the goal's answer says, best effort against required, and a model that cannot add an agent.

The agents reach each other through the in-memory dispatcher; the external agent is a handler
registered for the ``a2a`` target (the A2A wire itself is the integration tests')."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from stratagem.agents import (
    Agent,
    OrchestratorAgent,
    OrchestratorPlanner,
    PerceptionAgent,
    ScriptedModelClient,
)
from stratagem.agents._model_planner import ModelPlanningConfig
from stratagem.agents._model_roles import OrchestratorModelPlanner, model_planner
from stratagem.agents._roles import build_in_memory
from stratagem.planning import (
    CrossAgentStep,
    InMemoryStateStore,
    Plan,
    StateStore,
    ToolStep,
    validate_plan,
)
from stratagem.protocol import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    RemoteError,
    SubmitGoalRequest,
    SubmitGoalResponse,
    WireModel,
)
from stratagem.protocol._a2a._client import SendA2AMessageRequest, SendA2AMessageResponse
from tests.unit.agents.conftest import call, load_goal

CROWN = load_goal("crown")
KNOWN = ("reviewer", "critic", "archivist")

Remote = Callable[[SendA2AMessageRequest], Awaitable[SendA2AMessageResponse]]


def goal(**fields: Any) -> SubmitGoalRequest:
    return CROWN.model_copy(update=fields)


def step(plan: Plan, step_id: str) -> Any:
    return next(s for s in plan.steps if s.id == step_id)


class Setup:
    """The four agents in memory, an orchestrator that knows ``known`` external agents, and the
    external agents as one handler of the ``a2a`` target (what each was sent, in ``sent``)."""

    def __init__(
        self, remote: Remote, *, known: tuple[str, ...] = KNOWN, store: StateStore | None = None
    ) -> None:
        agents, self.dispatcher = build_in_memory(entry_points=False)
        self.perception = agents["perception"]
        self.sent: list[SendA2AMessageRequest] = []

        async def external(request: WireModel) -> WireModel:
            assert isinstance(request, SendA2AMessageRequest)
            self.sent.append(request)
            return await remote(request)

        self.dispatcher.register("a2a", "SendA2AMessage", external)
        self.orchestrator: Agent = OrchestratorAgent(
            dispatcher=self.dispatcher, a2a_agents=known, store=store
        )

    async def submit(self, request: SubmitGoalRequest) -> SubmitGoalResponse:
        answer = await self.orchestrator.handle(
            "SubmitGoal", request, call("SubmitGoal", "orchestrator")
        )
        assert isinstance(answer, SubmitGoalResponse)
        return answer

    def asked(self, capability: str) -> list[str]:
        return [c.step_id for c in self.dispatcher.calls if c.capability == capability]


async def reviews(request: SendA2AMessageRequest) -> SendA2AMessageResponse:
    beats = (request.data or {}).get("beats", [])
    return SendA2AMessageResponse(
        task_id="task-7",
        state="completed",
        text=f"{request.agent}: {len(beats)} beats read",
        data={"verdict": "fine", "beats": [b["id"] for b in beats]},
    )


async def fails(request: SendA2AMessageRequest) -> SendA2AMessageResponse:
    raise FailedPreconditionError(f"{request.agent}'s task t-1 ended failed: out of ink")


async def hangs(request: SendA2AMessageRequest) -> SendA2AMessageResponse:
    raise DeadlineExceededError(f"{request.agent} did not answer within 5 s")


async def denied(request: SendA2AMessageRequest) -> SendA2AMessageResponse:
    # What the A2A dispatcher raises when the orchestrator's policy refuses the agent.
    raise PermissionDeniedError(f"'orchestrator' may not call the A2A agent {request.agent!r}")


# --- the deterministic planner -----------------------------------------------------------------


def test_the_planner_consults_each_named_agent_once_the_arc_is_planned() -> None:
    planner = OrchestratorPlanner(KNOWN)
    plan = planner.plan("SubmitGoal", goal(consult=["reviewer", "critic"]), plan_id="g1")
    consults = [s for s in plan.steps if isinstance(s, CrossAgentStep) and s.target == "a2a"]
    assert [s.id for s in consults] == ["consult_reviewer", "consult_critic"]
    ask = step(plan, "consult_reviewer")
    assert (ask.capability, ask.depends_on, ask.retry.max_attempts) == (
        "SendA2AMessage",
        ["arc"],
        2,
    )
    assert ask.request["agent"] == "reviewer"
    assert ask.request["text"].startswith(f"Goal: {CROWN.goal}\n\nPassage:\n{CROWN.passage}")
    assert ask.request["data"] == {
        "goal": CROWN.goal,
        "passage": CROWN.passage,
        "world": "g1",
        "beats": {"$ref": "arc.beats"},
    }
    # Best effort: a route on failure per consultation, and the world's change waits for none.
    waive = step(plan, "waive_reviewer")
    assert isinstance(waive, ToolStep)
    assert (waive.tool, waive.runs_on, waive.depends_on) == (
        "waive_consultation",
        "failure",
        ["consult_reviewer"],
    )
    assert step(plan, "apply").depends_on == ["beat_1", "beat_2", "beat_3"]
    assert ("waive_critic", "orchestrator", "waive_consultation") in [
        (a.step, a.agent, a.capability) for a in plan.assignments
    ]
    validate_plan(plan, tools=OrchestratorAgent().registry)
    # A goal that consults nobody is planned as before.
    plain = planner.plan("SubmitGoal", CROWN, plan_id="g2")
    assert not [s for s in plain.steps if s.id.startswith(("consult_", "waive_"))]


def test_required_consultations_have_no_route_and_the_world_waits_for_them() -> None:
    plan = OrchestratorPlanner(KNOWN).plan(
        "SubmitGoal", goal(consult=["critic"], consult_required=True), plan_id="g1"
    )
    assert not [s for s in plan.steps if s.id.startswith("waive_")]
    assert step(plan, "apply").depends_on == ["beat_1", "beat_2", "beat_3", "consult_critic"]


def test_a_goal_names_an_agent_once_in_a_valid_name() -> None:
    with pytest.raises(ValueError, match="names reviewer more than once"):
        SubmitGoalRequest.model_validate({**CROWN.model_dump(), "consult": ["reviewer"] * 2})
    with pytest.raises(ValueError, match=r"consult\.0"):
        SubmitGoalRequest.model_validate({**CROWN.model_dump(), "consult": ["Not A Name"]})


# --- the goal, through the agents --------------------------------------------------------------


async def test_an_unknown_agent_is_refused_in_one_line_before_anything_runs() -> None:
    setup = Setup(reviews)
    with pytest.raises(InvalidArgumentError) as refused:
        await setup.submit(goal(consult=["reviewer", "oracle"]))
    assert refused.value.message == (
        "the goal consults 'oracle': not an external A2A agent of the orchestrator "
        "(configured in STRATAGEM_A2A_AGENTS: archivist, critic, reviewer)"
    )
    assert setup.dispatcher.calls == []
    alone = Setup(reviews, known=())
    with pytest.raises(InvalidArgumentError, match=r"STRATAGEM_A2A_AGENTS: none\)$"):
        await alone.submit(goal(consult=["reviewer"]))
    assert alone.dispatcher.calls == []


async def test_the_answer_carries_what_the_consulted_agent_said() -> None:
    setup = Setup(reviews)
    answer = await setup.submit(goal(consult=["reviewer"], plan_id="goal-consulted"))
    assert answer.status == "succeeded"
    (sent,) = setup.sent
    assert sent.agent == "reviewer"
    assert sent.data is not None
    assert [b["id"] for b in sent.data["beats"]] == [b.id for b in answer.beats]
    (consulted,) = answer.consultations
    assert consulted.model_dump() == {
        "agent": "reviewer",
        "status": "answered",
        "task_id": "task-7",
        "state": "completed",
        "text": "reviewer: 3 beats read",
        "data_json": json.dumps({"beats": ["beat_1", "beat_2", "beat_3"], "verdict": "fine"}),
        "error": "",
    }
    (dispatched,) = [c for c in setup.dispatcher.calls if c.target == "a2a"]
    # The message's id is the step's request id: the same on a retry, answered once remotely.
    assert (dispatched.caller, dispatched.step_id, dispatched.request_id) == (
        "orchestrator",
        "consult_reviewer",
        "goal-consulted@1:consult_reviewer",
    )


async def test_a_failed_consultation_is_recorded_and_the_goal_goes_on() -> None:
    setup = Setup(fails)
    answer = await setup.submit(goal(consult=["reviewer"]))
    assert answer.status == "succeeded"
    assert answer.added  # the world changed all the same
    (consulted,) = answer.consultations
    assert (consulted.agent, consulted.status) == ("reviewer", "failed")
    assert consulted.error == "FAILED_PRECONDITION: reviewer's task t-1 ended failed: out of ink"
    (record,) = setup.orchestrator.plans(answer.plan_id)
    statuses = {s["id"]: s["status"] for s in json.loads(record.plan_json)["steps"]}
    assert (statuses["consult_reviewer"], statuses["waive_reviewer"]) == ("failed", "succeeded")


async def test_a_consultation_the_policy_refuses_is_recorded_and_the_goal_goes_on() -> None:
    setup = Setup(denied)
    answer = await setup.submit(goal(consult=["reviewer"]))
    assert answer.status == "succeeded"
    (consulted,) = answer.consultations
    assert consulted.status == "failed"
    assert consulted.error == (
        "PERMISSION_DENIED: 'orchestrator' may not call the A2A agent 'reviewer'"
    )
    assert setup.asked("SendA2AMessage") == ["consult_reviewer"]  # a refusal is not retried


async def test_a_remote_that_times_out_is_tried_twice_then_waived() -> None:
    setup = Setup(hangs)
    answer = await setup.submit(goal(consult=["critic"]))
    assert answer.status == "succeeded"
    assert setup.asked("SendA2AMessage") == ["consult_critic", "consult_critic"]
    (consulted,) = answer.consultations
    assert consulted.status == "failed"
    assert "critic did not answer within 5 s" in consulted.error


async def test_a_required_consultation_that_fails_fails_the_goal_before_the_world_changes() -> None:
    setup = Setup(fails)
    with pytest.raises(FailedPreconditionError, match=r"consult_reviewer.*out of ink"):
        await setup.submit(goal(consult=["reviewer"], consult_required=True, plan_id="g-req"))
    assert setup.asked("UpdateWorldState") == []
    perception = setup.perception
    assert isinstance(perception, PerceptionAgent)
    # The passage was read into the goal's world; nothing was applied to it.
    facts = perception.worlds.get("g-req").facts()
    assert facts
    assert not [f for f in facts if f.predicate == "has" and f.subject == "mira"]


async def test_a_goal_answered_from_the_store_keeps_why_a_consultation_failed() -> None:
    store = InMemoryStateStore()
    first = Setup(fails, store=store)
    request = goal(consult=["reviewer"], plan_id="goal-stored")
    answered = await first.submit(request)
    # The same request again, to an orchestrator that restarted before its answer was kept: the
    # stored plan answers; nothing runs again.
    again = Setup(fails, store=store)
    replayed = await again.submit(request)
    assert again.dispatcher.calls == []
    assert replayed.consultations == answered.consultations
    assert replayed.consultations[0].error.endswith("out of ink")


# --- the model planner -------------------------------------------------------------------------


def _shape(
    shape: str, consult: list[str] | None = None, goals: Sequence[tuple[str, str, str]] = ()
) -> str:
    answer: dict[str, Any] = {
        "shape": shape,
        "goals": [dict(zip(("subject", "predicate", "object"), g, strict=True)) for g in goals],
    }
    if consult is not None:
        answer["consult"] = consult
    return json.dumps(answer)


def _with_model(setup: Setup, script: list[str], **config: Any) -> ScriptedModelClient:
    client = ScriptedModelClient(script, model="tiny")
    planner = model_planner(setup.orchestrator, client, ModelPlanningConfig(**config))
    assert isinstance(planner, OrchestratorModelPlanner)
    setup.orchestrator.use_planner(planner)
    return client


async def test_a_model_chooses_among_the_goals_agents_and_cannot_add_one() -> None:
    setup = Setup(reviews)
    client = _with_model(
        setup,
        # "archivist" is configured, but this goal does not name it.
        [_shape("arc", ["archivist", "reviewer"]), _shape("arc", ["reviewer"])],
    )
    answer = await setup.submit(goal(consult=["reviewer", "critic"]))
    # The schema offers the goal's agents only.
    schema = client.requests[0].schema
    assert schema is not None
    assert schema["properties"]["consult"]["items"]["enum"] == ["reviewer", "critic"]
    assert "consult" in schema["required"]
    assert "External agents you may consult" in client.requests[0].messages[-1].content
    critique = client.requests[1].messages[-1].content
    assert "consult: 'archivist' is not among the agents the goal allows consulting" in critique
    # The second answer consults the reviewer and leaves the critic out.
    assert [s.agent for s in setup.sent] == ["reviewer"]
    assert [(c.agent, c.status) for c in answer.consultations] == [("reviewer", "answered")]


async def test_a_model_cannot_consult_when_the_goal_names_nobody() -> None:
    setup = Setup(reviews)
    client = _with_model(setup, [_shape("arc", ["reviewer"])], max_repairs=0, fallback=False)
    with pytest.raises(RemoteError, match="not among the agents the goal allows consulting"):
        await setup.submit(goal())
    schema = client.requests[0].schema
    assert schema is not None
    assert "consult" not in schema["properties"]
    assert setup.sent == []


async def test_required_agents_are_consulted_whatever_the_model_answers() -> None:
    setup = Setup(reviews)
    tom = SubmitGoalRequest(
        goal="Mira goes to the garden",
        passage="Mira waits in the courtyard. The courtyard leads to the garden.",
        beats=1,
        consult=["critic"],
        consult_required=True,
    )
    client = _with_model(setup, [_shape("direct", [], [("mira", "at", "garden")])])
    answer = await setup.submit(tom)
    schema = client.requests[0].schema
    assert schema is not None
    assert "consult" not in schema["properties"]
    assert answer.status == "succeeded"
    assert [(c.agent, c.status) for c in answer.consultations] == [("critic", "answered")]
    (record,) = setup.orchestrator.plans(answer.plan_id)
    steps = {s["id"]: s for s in json.loads(record.plan_json)["steps"]}
    # A direct goal: consulted once the passage is read, about the one beat the model stated.
    assert steps["consult_critic"]["depends_on"] == ["spatial"]
    assert steps["apply"]["depends_on"] == ["beat_1", "consult_critic"]
    (sent,) = setup.sent
    assert sent.data is not None
    assert sent.data["beats"][0]["goals"] == [
        {"subject": "mira", "predicate": "at", "object": "garden"}
    ]


async def test_an_unknown_agent_is_refused_before_the_model_is_asked() -> None:
    setup = Setup(reviews, known=("reviewer",))
    client = _with_model(setup, [_shape("arc", [])])
    with pytest.raises(InvalidArgumentError, match="'critic': not an external A2A agent"):
        await setup.submit(goal(consult=["critic"]))
    assert client.requests == []
