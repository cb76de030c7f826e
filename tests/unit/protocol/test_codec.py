"""The codec: no drift between models and messages, exact round trips, violations by field path."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from stratagem.protocol import (
    CAPABILITIES,
    EXTENSION_FIELD,
    AgentCard,
    Beat,
    CapabilityCard,
    CapabilitySpec,
    ControlRequest,
    ExtractEntitiesRequest,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    PlanEvent,
    PlanExecutionSequenceRequest,
    PlanSnapshot,
    ProtocolUsageError,
    Relation,
    ReplayResult,
    RequestEnvelope,
    ResponseEnvelope,
    RevisionsResponse,
    WireModel,
    decode_card,
    decode_event,
    decode_plans,
    decode_request,
    decode_response,
    encode_card,
    encode_event,
    encode_plans,
    encode_request,
    encode_response,
    from_message,
    register_capability,
    to_message,
)
from stratagem.protocol._codec import _fill, encode_answer, encode_call, field_path
from stratagem.protocol._drift import schema_drift
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from stratagem.protocol._models import NoQuery, PlanQuery, PlansPage, PlansQuery, RunPlanRequest
from stratagem.protocol._service import decode_query, encode_query
from tests.unit.protocol._support import BEAT, MIRA_IN_HALL, SAMPLES, model_strategy

BUILTIN = [spec for spec in CAPABILITIES.values() if spec.field != EXTENSION_FIELD]


def _body_descriptor(envelope: type[pb.AgentRequest] | type[pb.AgentResponse], field: str):  # type: ignore[no-untyped-def]
    return envelope.DESCRIPTOR.fields_by_name[field].message_type


def _request(capability: str, body: WireModel, **ids: str) -> RequestEnvelope:
    spec = CAPABILITIES.get(capability)
    return RequestEnvelope(
        request_id="req-1",
        caller="orchestrator",
        target=spec.role if spec else "perception",
        capability=capability,
        body=body,
        **ids,
    )


# --- drift ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda spec: spec.name)
def test_capability_models_match_their_messages(spec: CapabilitySpec) -> None:
    assert schema_drift(spec.request, _body_descriptor(pb.AgentRequest, spec.field)) == []
    assert schema_drift(spec.response, _body_descriptor(pb.AgentResponse, spec.field)) == []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (AgentCard, pb.AgentCard),
        (CapabilityCard, pb.CapabilityCard),
        (PlanEvent, pb.PlanEvent),
        (PlanSnapshot, pb.PlanSnapshot),
        (PlansPage, pb.PlansResponse),
        (PlanQuery, pb.WatchRequest),
        (PlansQuery, pb.PlansRequest),
        (NoQuery, pb.DescribeRequest),
        (RunPlanRequest, pb.RunPlanRequest),
        (PlanQuery, pb.RevisionsRequest),
        (PlanQuery, pb.ReplayRequest),
        (ControlRequest, pb.ControlRequest),
        (ReplayResult, pb.ReplayResult),
        (RevisionsResponse, pb.RevisionsResponse),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_other_wire_models_match_their_messages(
    model: type[BaseModel], message: type[pb.AgentCard]
) -> None:
    assert schema_drift(model, message.DESCRIPTOR) == []


def test_envelopes_match_their_messages_apart_from_the_body() -> None:
    ignore = {"capability", "body"}
    assert schema_drift(RequestEnvelope, pb.AgentRequest.DESCRIPTOR, ignore=ignore) == []
    assert schema_drift(ResponseEnvelope, pb.AgentResponse.DESCRIPTOR, ignore=ignore) == []


@pytest.mark.parametrize("envelope", [pb.AgentRequest, pb.AgentResponse])
def test_every_body_field_is_a_registered_capability(
    envelope: type[pb.AgentRequest],
) -> None:
    fields = {field.name for field in envelope.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert fields == {spec.field for spec in BUILTIN} | {EXTENSION_FIELD}


class _Drifted(BaseModel):
    """Beat, drifted every way the check knows."""

    id: int = Field(ge=0, le=10)  # str in the proto
    title: list[str]  # singular in the proto
    goals: list[Beat]  # Relation in the proto
    extra: str  # not in the proto
    # "purpose" is missing


class _Unbounded(BaseModel):
    world_version: int = Field(ge=0)  # no upper bound: may not fit an int32
    entities: list[int] = []
    relations: list[Relation] = []


def test_drift_is_reported() -> None:
    problems = schema_drift(_Drifted, pb.Beat.DESCRIPTOR)
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "'extra' only on the model" in text
    assert "'purpose' only in the proto" in text
    assert "_Drifted / stratagem.v1.Beat.id: str in the proto" in text
    assert ".title: repeated only in the model" in text
    assert ".goals: nested type Beat on the model, Relation in the proto" in text


def test_unbounded_ints_and_scalar_for_message_are_reported() -> None:
    problems = schema_drift(_Unbounded, pb.ExtractEntitiesResponse.DESCRIPTOR)
    assert len(problems) == 2, problems
    assert "world_version: int not bounded" in problems[1]
    assert "entities: a Entity message in the proto" in problems[0]


# --- round trips --------------------------------------------------------------------------------


def test_samples_cover_every_builtin_capability() -> None:
    assert set(SAMPLES) == {spec.name for spec in BUILTIN}


@pytest.mark.parametrize("capability", sorted(SAMPLES))
def test_request_and_response_round_trip(capability: str) -> None:
    request, response = SAMPLES[capability]
    envelope = _request(capability, request, plan_id="goal-1/arc", step_id="extract")
    assert decode_request(encode_request(envelope)) == envelope
    answer = ResponseEnvelope(
        request_id="req-1",
        responder=CAPABILITIES[capability].role,
        capability=capability,
        body=response,
    )
    assert decode_response(encode_response(answer)) == answer


def test_a_nested_message_with_default_fields_stays_present() -> None:
    message = to_message(
        PlanExecutionSequenceRequest(beat=BEAT, facts=[MIRA_IN_HALL]),
        pb.PlanExecutionSequenceRequest,
    )
    assert message.HasField("beat")
    assert from_message(message, PlanExecutionSequenceRequest).beat == BEAT


def test_an_unset_nested_message_is_a_missing_field() -> None:
    message = pb.PlanExecutionSequenceRequest(
        facts=[pb.Relation(subject="a", predicate="at", object="b")], max_depth=4
    )
    with pytest.raises(InvalidArgumentError) as caught:
        from_message(message, PlanExecutionSequenceRequest)
    assert caught.value.violations == (FieldViolation("beat", "Field required"),)


def test_cards_events_and_snapshots_round_trip() -> None:
    card = AgentCard(
        role="perception",
        version="1.0",
        capabilities=[CapabilityCard.from_spec(CAPABILITIES["ExtractEntities"])],
        tools=["extract", "resolve"],
        planner="model",
        planning_timeout_s=180.0,
        model="big (strong) at http://10.0.0.2:8000/v1",
    )
    assert decode_card(encode_card(card)) == card
    schema = json.loads(card.capabilities[0].request_schema)
    assert schema["properties"]["text"]["maxLength"] == 20_000
    event = PlanEvent(
        plan_id="goal-1",
        revision=2,
        step_id="arc",
        status="running",
        attempt=1,
        timestamp=1.5,
        agent="strategic",
    )
    assert decode_event(encode_event(event)) == event
    snapshots = [
        PlanSnapshot(
            plan_id="goal-1", agent="orchestrator", revision=1, status="running", plan_json="{}"
        ),
        PlanSnapshot(plan_id="goal-1/arc", agent="strategic", status="succeeded"),
    ]
    assert decode_plans(encode_plans(snapshots)) == snapshots
    assert decode_plans(encode_plans([])) == []


def test_read_queries_round_trip() -> None:
    assert decode_query("Watch", encode_query("Watch", "goal-1")) == "goal-1"
    assert decode_query("Plans", encode_query("Plans")) == ""
    assert decode_query("Describe", encode_query("Describe")) == ""
    with pytest.raises(ProtocolUsageError):
        encode_query("Describe", "goal-1")
    with pytest.raises(ProtocolUsageError):
        encode_query("Watch", "no spaces allowed")


# --- validation ---------------------------------------------------------------------------------


def test_a_bad_field_is_named_by_its_path() -> None:
    message = pb.AgentRequest.FromString(
        encode_request(_request("PlanExecutionSequence", SAMPLES["PlanExecutionSequence"][0]))
    )
    message.plan_execution_sequence.beat.goals[0].predicate = "flies"
    message.plan_execution_sequence.facts[1].subject = "Not A Slug"
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    fields = [violation.field for violation in caught.value.violations]
    assert fields == ["beat.goals[0].predicate", "facts[1].subject"]
    assert "PlanExecutionSequence" in caught.value.message


def test_a_missing_required_text_is_a_violation() -> None:
    message = pb.AgentRequest(request_id="r", caller="operator", target="perception")
    message.extract_entities.SetInParent()
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    assert [v.field for v in caught.value.violations] == ["text"]


def test_envelope_fields_are_validated() -> None:
    message = pb.AgentRequest.FromString(
        encode_request(_request("ExtractEntities", SAMPLES["ExtractEntities"][0]))
    )
    message.caller = "Not An Identity"
    message.request_id = ""
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    assert {v.field for v in caught.value.violations} == {"caller", "request_id"}


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff", b"\x0a\x05ab"])
def test_unparseable_bytes_are_invalid_argument(data: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot parse"):
        decode_request(data)
    with pytest.raises(InvalidArgumentError, match="cannot parse"):
        decode_response(data)


def test_an_envelope_without_a_body_is_invalid() -> None:
    data = pb.AgentRequest(
        request_id="r", caller="operator", target="perception"
    ).SerializeToString()
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(data)
    assert caught.value.violations[0].field == "body"


def test_an_envelope_checks_its_body_model() -> None:
    with pytest.raises(ValidationError, match="is a ExtractEntitiesRequest, not a AnalyzeNarr"):
        _request("ExtractEntities", SAMPLES["AnalyzeNarrative"][0])
    with pytest.raises(ValidationError, match="unknown capability"):
        _request("Teleport", SAMPLES["ExtractEntities"][0])
    with pytest.raises(ValidationError, match="response is a ExtractEntitiesResponse, not a Ex"):
        ResponseEnvelope(
            request_id="r",
            responder="perception",
            capability="ExtractEntities",
            body=SAMPLES["ExtractEntities"][0],
        )


def test_a_value_protobuf_cannot_carry_is_a_usage_error() -> None:
    # pydantic refuses a lone surrogate itself; a model built without validation reaches the codec.
    body = ExtractEntitiesRequest.model_construct(text="lone \ud800 surrogate")
    with pytest.raises(ProtocolUsageError, match="cannot encode text"):
        encode_request(_request("ExtractEntities", body))


def test_field_path() -> None:
    assert field_path(("beat", "goals", 0, "predicate")) == "beat.goals[0].predicate"
    assert field_path((0, "x")) == "[0].x"
    assert field_path(()) == ""


# --- extension capabilities ---------------------------------------------------------------------


class EchoRequest(WireModel):
    words: list[str] = Field(min_length=1, max_length=4)
    loud: bool = False


class EchoResponse(WireModel):
    text: str


ECHO = CapabilitySpec("Echo", "perception", EXTENSION_FIELD, EchoRequest, EchoResponse, version="2")


@pytest.fixture
def echo() -> Iterator[CapabilitySpec]:
    register_capability(ECHO)
    yield ECHO
    del CAPABILITIES[ECHO.name]


def _extension(capability: str, version: str, payload: bytes) -> bytes:
    message = pb.AgentRequest(request_id="r", caller="operator", target="perception")
    message.extension.CopyFrom(
        pb.ExtensionBody(capability=capability, version=version, payload_json=payload)
    )
    return message.SerializeToString()


def test_an_extension_round_trips_as_json(echo: CapabilitySpec) -> None:
    envelope = _request("Echo", EchoRequest(words=["hi"], loud=True))
    data = encode_request(envelope)
    extension = pb.AgentRequest.FromString(data).extension
    assert (extension.capability, extension.version) == ("Echo", "2")
    assert json.loads(extension.payload_json) == {"words": ["hi"], "loud": True}
    assert decode_request(data) == envelope
    answer = ResponseEnvelope(
        request_id="r", responder="perception", capability="Echo", body=EchoResponse(text="HI")
    )
    assert decode_response(encode_response(answer)) == answer


def test_an_extension_is_validated_by_its_model(echo: CapabilitySpec) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(_extension("Echo", "2", b'{"words": ["a", 3], "colour": 1}'))
    assert {v.field for v in caught.value.violations} == {"words[1]", "colour"}
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(_extension("Echo", "2", b"{not json"))
    assert caught.value.violations[0].field == "payload_json"


def test_an_extension_of_another_version_is_a_failed_precondition(echo: CapabilitySpec) -> None:
    with pytest.raises(
        FailedPreconditionError, match=r"Echo version '1' was sent; this side speaks version '2'"
    ):
        decode_request(_extension("Echo", "1", b'{"words": ["a"]}'))


def test_an_unknown_or_builtin_extension_is_invalid() -> None:
    for name in ("Teleport", "ExtractEntities"):
        with pytest.raises(InvalidArgumentError) as caught:
            decode_request(_extension(name, "1", b"{}"))
        assert caught.value.violations[0].field == "extension.capability"


# --- property: every valid model survives the wire unchanged --------------------------------------

_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda spec: spec.name)
@_SETTINGS
@given(data=st.data())
def test_generated_models_round_trip(spec: CapabilitySpec, data: st.DataObject) -> None:
    request = data.draw(model_strategy(spec.request))
    envelope = _request(spec.name, request)
    assert decode_request(encode_request(envelope)) == envelope
    response = data.draw(model_strategy(spec.response))
    answer = ResponseEnvelope(
        request_id="r", responder=spec.role, capability=spec.name, body=response
    )
    assert decode_response(encode_response(answer)) == answer


@_SETTINGS
@given(
    card=model_strategy(AgentCard),
    event=model_strategy(PlanEvent),
    snapshots=st.lists(model_strategy(PlanSnapshot), max_size=3),
)
def test_generated_cards_events_and_snapshots_round_trip(
    card: AgentCard, event: PlanEvent, snapshots: list[PlanSnapshot]
) -> None:
    assert decode_card(encode_card(card)) == card
    assert decode_event(encode_event(event)) == event
    assert decode_plans(encode_plans(snapshots)) == snapshots


# --- the compiled fast paths write what the generic walk writes ----------------------------------


def _walked(model: BaseModel, message_type: type[pb.AgentRequest]) -> bytes:
    message = message_type()
    _fill(message, model, "")
    return message.SerializeToString()


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda spec: spec.name)
@_SETTINGS
@given(data=st.data())
def test_fast_encoding_matches_the_generic_walk(spec: CapabilitySpec, data: st.DataObject) -> None:
    for model, side in ((spec.request, pb.AgentRequest), (spec.response, pb.AgentResponse)):
        value = data.draw(model_strategy(model))
        message_type = getattr(pb, _body_descriptor(side, spec.field).name)
        assert to_message(value, message_type).SerializeToString() == _walked(value, message_type)
    request = data.draw(model_strategy(spec.request))
    envelope = _request(spec.name, request, plan_id="goal-1")
    walked = pb.AgentRequest()
    _fill(walked, envelope, "")
    nested = getattr(walked, spec.field)
    nested.SetInParent()
    _fill(nested, request, "")
    assert encode_request(envelope) == walked.SerializeToString()
    assert encode_call(
        spec,
        request_id="req-1",
        caller="orchestrator",
        target=spec.role,
        plan_id="goal-1",
        step_id="",
        body=request,
    ) == encode_request(envelope)
    response = data.draw(model_strategy(spec.response))
    answer = encode_answer(spec, "req-1", spec.role, response)
    assert answer == encode_response(
        ResponseEnvelope(
            request_id="req-1", responder=spec.role, capability=spec.name, body=response
        )
    )
    assert decode_response(answer).body == response


def test_encode_answer_refuses_another_model() -> None:
    spec = CAPABILITIES["ExtractEntities"]
    with pytest.raises(ProtocolUsageError, match="is a ExtractEntitiesResponse, not a Beat"):
        encode_answer(spec, "req-1", "perception", BEAT)


def test_a_value_the_fast_path_cannot_carry_still_names_its_field() -> None:
    # A lone surrogate breaks the one-call constructor; the generic walk names the field.
    body = ExtractEntitiesRequest.model_construct(text="\ud800")
    with pytest.raises(ProtocolUsageError, match="cannot encode text"):
        to_message(body, pb.ExtractEntitiesRequest)
    with pytest.raises(ProtocolUsageError, match="cannot encode text"):
        encode_call(
            CAPABILITIES["ExtractEntities"],
            request_id="req-1",
            caller="orchestrator",
            target="perception",
            plan_id="",
            step_id="",
            body=body,
        )
