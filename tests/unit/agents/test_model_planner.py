"""ModelPlanner with the scripted model: constrained answers, validation, critiques, fallback,
budgets, journaling, re-derivation and GenAI telemetry."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from stratagem.agents import Agent, ChatResponse, ScriptedModelClient, ToolRegistry, tool
from stratagem.agents._model_planner import (
    ModelPlanner,
    ModelPlanningConfig,
    plan_answer_schema,
    rederive,
)
from stratagem.agents._model_trace import TracedModelClient
from stratagem.planning import (
    Budget,
    Engine,
    FailureClass,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanStatus,
    PolicyError,
    StepFailure,
    StepStatus,
    ToolStep,
    TransientError,
    failure_repaired,
)
from stratagem.protocol import ExtractEntitiesRequest, ExtractEntitiesResponse, WireModel
from tests.unit.agents.conftest import call


class Words(BaseModel):
    words: list[str]


class Count(BaseModel):
    count: int


@tool
async def split_words(text: str) -> Words:
    """Split a text into words."""
    return Words(words=text.split())


@tool
async def count_words(words: list[str], minimum: int = 0) -> Count:
    """Count the words longer than a minimum."""
    return Count(count=sum(1 for w in words if len(w) > minimum))


def _registry() -> ToolRegistry:
    registry = ToolRegistry("perception")
    registry.register(split_words)
    registry.register(count_words)
    return registry


class Deterministic:
    """The role's own planner: one split step."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        assert isinstance(request, ExtractEntitiesRequest)
        return Plan(
            id=plan_id,
            owner="perception",
            goal="split the text",
            steps=[ToolStep(id="split", tool="split_words", input={"text": request.text})],
        )

    def respond(self, capability: str, request: WireModel, result: Any) -> WireModel:
        raise NotImplementedError


REQUEST = ExtractEntitiesRequest(text="Lena Park found the body in the library.")


def _answer(*steps: dict[str, Any], goal: str = "count the words") -> str:
    return json.dumps({"goal": goal, "steps": list(steps)})


GOOD = _answer(
    {"id": "split", "tool": "split_words", "input": {"text": "Lena Park found the body"}},
    {
        "id": "count",
        "tool": "count_words",
        "depends_on": ["split"],
        "input": {"words": {"$ref": "split.words"}, "minimum": 3},
    },
)
FOREIGN = _answer({"id": "a", "tool": "search_sequence", "input": {}})
CYCLE = _answer(
    {"id": "a", "tool": "split_words", "depends_on": ["b"], "input": {"text": "x"}},
    {"id": "b", "tool": "split_words", "depends_on": ["a"], "input": {"text": "y"}},
)
BAD_REF = _answer(
    {"id": "count", "tool": "count_words", "input": {"words": {"$ref": "nowhere.words"}}},
)


def _planner(script: list[Any], **config: Any) -> tuple[ModelPlanner, ScriptedModelClient]:
    client = ScriptedModelClient(script, model="tiny")
    budget = config.pop("budget", None)
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=_registry(),
        client=client,
        deterministic=Deterministic(),
        config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0), **config),
        budget=budget,
    )
    return planner, client


def test_the_schema_names_only_the_agents_tools_with_their_inputs_and_bounds() -> None:
    schema = plan_answer_schema(_registry(), max_steps=5)
    steps = schema["properties"]["steps"]
    assert steps["maxItems"] == 5
    tool_steps = [v["$ref"].rpartition("/")[2] for v in steps["items"]["anyOf"] if "$ref" in v]
    assert sorted(tool_steps) == ["tool__count_words", "tool__split_words"]
    jsonschema.Draft202012Validator.check_schema(schema)
    literal = json.loads(GOOD)
    literal["steps"][1]["input"]["words"] = ["Lena", "Park"]
    jsonschema.validate(literal, schema)  # a plan of literal inputs follows it
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(FOREIGN), schema)


async def test_an_accepted_plan_carries_its_journal() -> None:
    planner, client = _planner([GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert [s.id for s in plan.steps] == ["split", "count"]
    assert plan.provenance is not None
    assert plan.provenance.author == "model:tiny"
    assert plan.provenance.capability == "ExtractEntities"
    assert plan.provenance.request == REQUEST.model_dump(mode="json")
    (call,) = plan.provenance.calls
    assert (call.outcome, call.response, call.finish_reason) == ("accepted", GOOD, "stop")
    assert call.input_tokens > 0
    assert client.requests[0].schema == planner.schema
    assert "split_words" in client.requests[0].messages[0].content


async def test_a_foreign_tool_a_cycle_and_a_bad_reference_never_become_a_plan() -> None:
    planner, client = _planner([FOREIGN, CYCLE, BAD_REF], fallback=False)
    with pytest.raises(LogicError, match=r"refused 3 times; last: .*nowhere") as caught:
        await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert "nowhere" in str(caught.value)
    # Each refusal went back as the next request's critique.
    second, third = client.requests[1].messages[-1].content, client.requests[2].messages[-1].content
    assert "'search_sequence', which is not in the perception agent's registry" in second
    assert "cycle" in third


async def test_cut_and_non_json_answers_are_critiqued_and_a_later_answer_accepted() -> None:
    cut = ChatResponse(content='{"goal": "x", "st', model="tiny", finish_reason="length")
    planner, _ = _planner([cut, "not json at all", GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    outcomes = [c.outcome for c in plan.provenance.calls]
    assert "cut at the token limit" in outcomes[0]
    assert "not JSON" in outcomes[1]
    assert outcomes[2] == "accepted"
    assert plan.provenance.calls[2].critique.startswith("the model's answer is not JSON")


async def test_a_bad_tool_input_is_refused_before_the_plan_runs() -> None:
    bad = _answer({"id": "split", "tool": "split_words", "input": {"text": 7}})
    planner, _ = _planner([bad], max_repairs=0, fallback=False)
    with pytest.raises(LogicError, match="step 'split' input text"):
        await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")


async def test_after_the_last_refusal_the_deterministic_plan_is_used_and_named() -> None:
    planner, _ = _planner([FOREIGN, FOREIGN, FOREIGN])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert [s.id for s in plan.steps] == ["split"]
    assert plan.provenance is not None
    assert plan.provenance.author == "planner:perception"
    assert len(plan.provenance.calls) == 3


async def test_a_call_past_the_token_budget_is_not_sent() -> None:
    planner, client = _planner([FOREIGN, GOOD], budget=Budget(model_tokens=700), max_tokens=512)
    with pytest.raises(PolicyError, match="model call 2 of the perception planner would pass"):
        await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert len(client.requests) == 1


async def test_an_unreachable_server_is_retried_then_transient() -> None:
    planner, client = _planner([TransientError("down"), TransientError("down"), GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    assert len(client.requests) == 3
    planner, _ = _planner([TransientError("down")] * 3)
    with pytest.raises(TransientError, match="tried 3 times"):
        await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")


async def test_a_logic_failure_while_running_is_repaired_within_the_repairs_left() -> None:
    repaired = _answer({"id": "split", "tool": "split_words", "input": {"text": "again"}})
    planner, client = _planner([GOOD, repaired], max_repairs=1)
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    failure = StepFailure(
        step_id="count", failure_class=FailureClass.LOGIC, message="too few words", attempts=1
    )
    new = await planner.replan(plan, failure)
    assert new is not None
    assert new.provenance is not None
    assert new.provenance.author == "model:tiny"
    assert [c.outcome for c in new.provenance.calls] == ["accepted", "accepted"]
    assert new.provenance.calls[1].critique == "step 'count' failed: too few words"
    assert "That plan failed while running" in client.requests[1].messages[-1].content
    # The one repair allowed is spent.
    assert await planner.replan(new, failure) is None


async def test_replay_rederives_the_plan_from_its_journal_without_the_model() -> None:
    planner, _ = _planner([FOREIGN, GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert await rederive(planner, "ExtractEntities", REQUEST, plan) == []
    # A journal whose answer was changed re-derives another plan.
    assert plan.provenance is not None
    calls = list(plan.provenance.calls)
    other = _answer({"id": "split", "tool": "split_words", "input": {"text": "other"}})
    calls[1] = calls[1].model_copy(update={"response": other})
    forged = plan.model_copy(
        update={"provenance": plan.provenance.model_copy(update={"calls": calls})}
    )
    assert await rederive(planner, "ExtractEntities", REQUEST, forged) == ["steps differs"]


async def test_model_calls_leave_genai_spans_and_metrics_without_content_or_key() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    traced = TracedModelClient(
        ScriptedModelClient([GOOD], model="tiny"),
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=_registry(),
        client=traced,
        deterministic=Deterministic(),
    )
    await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat tiny"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.response.model"] == "tiny"
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert int(str(attributes["gen_ai.usage.output_tokens"])) > 0
    assert "gen_ai.input.messages" not in attributes
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        metric.name
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert names == {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}


async def test_message_content_is_captured_only_when_asked() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = TracedModelClient(
        ScriptedModelClient([GOOD], model="tiny"), tracer_provider=provider, capture_content=True
    )
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=_registry(),
        client=traced,
        deterministic=Deterministic(),
    )
    await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert "Lena Park" in str(attributes["gen_ai.input.messages"])
    assert "split_words" in str(attributes["gen_ai.output.messages"])


# --- a repair made while the plan ran, re-derived by replay --------------------------------------


@tool
async def check_text(text: str) -> Words:
    """Check a text; a text with 'bad' in it fails (a logic failure: retrying will not help)."""
    if "bad" in text:
        raise LogicError(f"the text {text!r} is bad")
    return Words(words=text.split())


class Responding(Deterministic):
    def respond(self, capability: str, request: WireModel, result: Any) -> WireModel:
        return ExtractEntitiesResponse(entities=[], relations=[])


def _checking_planner(script: list[Any]) -> tuple[ModelPlanner, ScriptedModelClient]:
    registry = _registry()
    registry.register(check_text)
    client = ScriptedModelClient(script, model="tiny")
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=registry,
        client=client,
        deterministic=Responding(),
        config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0), max_repairs=2),
    )
    return planner, client


FAILS = _answer({"id": "check", "tool": "check_text", "input": {"text": "a bad text"}})
REPAIRED = _answer({"id": "check", "tool": "check_text", "input": {"text": "a good text"}})


async def test_replay_rederives_a_repair_the_model_made_while_the_plan_ran() -> None:
    planner, client = _checking_planner(["not json", FAILS, REPAIRED])
    agent = Agent("perception", planner.registry, Plan, planner, store=InMemoryStateStore())
    await agent.handle("ExtractEntities", REQUEST, call("ExtractEntities", "perception"))
    (record,) = list(agent.plans(""))
    plan = agent.record(record.plan_id).plan
    assert plan.revision == 2
    assert plan.provenance is not None
    assert [c.outcome for c in plan.provenance.calls][1:] == ["accepted", "accepted"]
    assert client.remaining == 0  # the script is spent: replay cannot ask it anything
    report = await agent.replay(record.plan_id)
    assert report.divergences == []
    assert report.decisions == 4 * 1 + 1 + 1  # one step, the plan, the model plan's derivation

    # The same journal with another failure asks the model something else than it recorded;
    # a changed repair answer derives other steps.
    (_, second) = await agent.store.revisions(record.plan_id)  # type: ignore[union-attr]
    failure = failure_repaired(second)
    assert failure is not None
    assert failure.step_id == "check"
    assert "is bad" in failure.message
    other = StepFailure("check", FailureClass.LOGIC, "another reason", attempts=1)
    assert await planner.rederive(plan, [other]) == [
        "the model was asked something else than the journal recorded"
    ]
    calls = list(plan.provenance.calls)
    calls[2] = calls[2].model_copy(update={"response": FAILS})
    forged = plan.model_copy(
        update={"provenance": plan.provenance.model_copy(update={"calls": calls})}
    )
    differences = await planner.rederive(forged, [failure])
    assert differences is not None
    assert "steps differs" in differences


# --- the dynamic forms in the answer --------------------------------------------------------------


def _deciding_answer(**loop: Any) -> dict[str, Any]:
    return {
        "goal": "count the words of each passage, then again until there are enough",
        "inputs": {"passages": ["Lena Park waits", "Park runs"]},
        "on_failure": "continue_independent",
        "steps": [
            {
                "kind": "map",
                "id": "each",
                "over": "inputs.passages",
                "max_items": 10,
                "tool": "split_words",
                "input": {"text": {"$expr": "item"}},
            },
            {
                "id": "count",
                "tool": "count_words",
                "depends_on": ["each"],
                "when": "length(each.items) > `1`",
                "input": {"words": {"$expr": "each.items[0].words"}},
            },
            {
                "id": "fallback",
                "tool": "count_words",
                "depends_on": ["count"],
                "runs_on": "failure",
                "priority": 3,
                "input": {"words": ["none"]},
            },
            {
                "kind": "loop",
                "id": "again",
                "depends_on": ["count"],
                "max_iterations": 3,
                "until": "split.words[0] == 'x'",
                "steps": [{"id": "split", "tool": "split_words", "input": {"text": "x y"}}],
                **loop,
            },
        ],
    }


def test_the_schema_admits_conditions_routes_maps_and_bounded_loops() -> None:
    schema = plan_answer_schema(_registry(), max_steps=5)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_deciding_answer(), schema)
    for unbounded in (
        {"max_iterations": 9},  # past the bound
        {"max_iterations": None},  # no bound
        {"steps": [_deciding_answer()["steps"][0]]},  # a map inside a loop: nothing nests
    ):
        answer = _deciding_answer(**unbounded)
        if unbounded.get("max_iterations", 0) is None:
            del answer["steps"][3]["max_iterations"]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(answer, schema)
    too_many = _deciding_answer()
    too_many["steps"][0]["max_items"] = 500
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(too_many, schema)


async def test_a_models_plan_with_a_map_a_branch_and_a_loop_is_accepted_and_runs() -> None:
    planner, _ = _planner([json.dumps(_deciding_answer())])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    assert plan.provenance.author == "model:tiny"
    assert [step.kind for step in plan.steps] == ["map", "tool", "tool", "loop"]
    assert plan.on_failure == "continue_independent"
    result = await Engine(tools=_registry(), agent="perception").run(plan)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.statuses["fallback"] is StepStatus.SKIPPED
    assert result.outputs["again"]["iterations"] == 1


async def test_a_models_map_over_what_is_not_a_list_is_refused_and_critiqued() -> None:
    bad = _deciding_answer()
    bad["steps"][0]["over"] = "length(inputs.passages)"
    planner, client = _planner([json.dumps(bad), json.dumps(_deciding_answer())])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    assert [call.outcome for call in plan.provenance.calls][1] == "accepted"
    assert "step 'each' maps over a number, not a list" in client.requests[1].messages[-1].content


async def test_a_10000_deep_answer_is_a_critique_not_a_crash() -> None:
    deep = "[" * 10_000 + "]" * 10_000
    planner, client = _planner([deep, '{"goal": ' + "{" * 5000, GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    outcomes = [c.outcome for c in plan.provenance.calls]
    assert outcomes[0] == "the model's answer is nested 10000 levels deep; a plan needs at most 32"
    assert "nested 5001 levels deep" in outcomes[1]
    assert outcomes[2] == "accepted"
    assert "nested 10000 levels deep" in client.requests[1].messages[-1].content


async def test_an_answer_with_a_negative_token_count_is_a_critique_and_replays() -> None:
    negative = ChatResponse(GOOD, "tiny", "stop", input_tokens=-5, output_tokens=7)
    planner, _ = _planner([negative, GOOD])
    plan = await planner.plan("ExtractEntities", REQUEST, plan_id="goal-1")
    assert plan.provenance is not None
    first, second = plan.provenance.calls
    assert first.outcome == "the server reported a negative token count for the answer: not used"
    assert (first.input_tokens, first.output_tokens, first.finish_reason) == (
        0,
        0,
        "invalid_usage",
    )
    assert second.outcome == "accepted"
    # The journal refuses it again with no model: replay re-derives the same plan.
    assert await rederive(planner, "ExtractEntities", REQUEST, plan) == []


async def test_deep_and_negative_answers_reach_the_caller_as_the_fallback_not_internal() -> None:
    deep = "{" * 10_000
    negative = ChatResponse(GOOD, "tiny", "stop", input_tokens=-1, output_tokens=-1)
    client = ScriptedModelClient([deep, negative, deep], model="tiny")
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=_registry(),
        client=client,
        deterministic=Responding(),
        config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0)),
    )
    agent = Agent("perception", _registry(), Plan, planner)
    answer = await agent.handle("ExtractEntities", REQUEST, call("ExtractEntities", "perception"))
    record = agent.record(agent.plans("")[0].plan_id)
    assert record.plan.provenance is not None
    assert record.plan.provenance.author == "planner:perception"
    assert answer is not None


async def test_a_plan_whose_goal_is_not_the_users_is_a_critique() -> None:
    from stratagem.protocol import PlanNarrativeArcRequest

    request = PlanNarrativeArcRequest(goal="Mira recovers the crown", protagonist="mira", beats=1)
    steps = {"id": "split", "tool": "split_words", "input": {"text": "Mira"}}
    rewritten = _answer(steps, goal="Old Tom goes to the garden")
    kept = _answer(steps, goal="mira  recovers the Crown")
    planner, _ = _planner([rewritten, kept])
    plan = await planner.plan("PlanNarrativeArc", request, plan_id="goal-1")
    assert plan.goal == "Mira recovers the crown"
    assert plan.provenance is not None
    first, second = plan.provenance.calls
    assert first.outcome == (
        "the plan's goal 'Old Tom goes to the garden' is not the user's goal "
        "'Mira recovers the crown': a plan may choose how to reach the goal, not what it is"
    )
    assert second.outcome == "accepted"


async def test_a_stream_chunk_nested_too_deeply_falls_back_not_internal() -> None:
    # A real OpenAI client over a fake transport: the first chunk carries a field 10,000 deep,
    # which the client library's JSON parse recursed on (before: the goal failed INTERNAL).
    import httpx2

    from stratagem.agents import ModelConfig, OpenAIModelClient

    deep = "[" * 10_000 + "]" * 10_000
    chunk = (
        '{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "tiny", '
        '"choices": [{"index": 0, "delta": {"content": "{", "extra": ' + deep + "}}]}"
    )
    body = f"data: {chunk}\n\ndata: [DONE]\n\n".encode()
    http = httpx2.AsyncClient(
        transport=httpx2.MockTransport(
            lambda r: httpx2.Response(
                200, headers={"content-type": "text/event-stream"}, content=body
            )
        )
    )
    client = OpenAIModelClient(
        ModelConfig(url="http://127.0.0.1:8089/v1", model="tiny", timeout_s=5.0), http_client=http
    )
    planner = ModelPlanner(
        role="perception",
        plan_type=Plan,
        registry=_registry(),
        client=client,
        deterministic=Responding(),
        config=ModelPlanningConfig(transient_delays_s=(0.0, 0.0), max_repairs=1),
    )
    agent = Agent("perception", _registry(), Plan, planner)
    answer = await agent.handle("ExtractEntities", REQUEST, call("ExtractEntities", "perception"))
    assert answer is not None
    record = agent.record(agent.plans("")[0].plan_id)
    assert record.plan.provenance is not None
    assert record.plan.provenance.author == "planner:perception"
    outcomes = [c.outcome for c in record.plan.provenance.calls]
    assert (
        outcomes
        == ["the model server's stream could not be read: a chunk is nested too deeply"] * 2
    )
