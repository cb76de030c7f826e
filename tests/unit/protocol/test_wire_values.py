"""General wire values for extension capabilities: a ``google.protobuf.Struct`` or a user's own
protobuf message in an ``Any``, validated on both sides like JSON, described by ``Describe``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf import any_pb2
from pydantic import Field

from examples.extensions.appraisal import appraisal_pb2
from stratagem.protocol import (
    CAPABILITIES,
    EXTENSION_FIELD,
    CapabilityCard,
    CapabilitySpec,
    InvalidArgumentError,
    RequestEnvelope,
    ResponseEnvelope,
    WireModel,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    register_capability,
)
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb


class Rate(WireModel):
    text: str = Field(min_length=1, max_length=200)
    scale: int = Field(default=10, ge=1, le=100)


class Rating(WireModel):
    rating: float = Field(ge=0)
    words: list[str] = Field(default_factory=list)


class AskAbout(WireModel):
    entity_id: str = Field(min_length=1, max_length=64)
    predicates: list[str] = Field(default_factory=list, max_length=8)


class Appraised(WireModel):
    entity_id: str = Field(max_length=64)
    facts: int = Field(ge=0, le=2**31 - 1)
    about: list[str] = Field(default_factory=list)


STRUCT = CapabilitySpec("TestRate", "strategic", EXTENSION_FIELD, Rate, Rating, wire="struct")
MESSAGE = CapabilitySpec(
    "TestAppraise",
    "perception",
    EXTENSION_FIELD,
    AskAbout,
    Appraised,
    wire="message",
    messages=(appraisal_pb2.AppraiseRequest, appraisal_pb2.Appraisal),
)


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    saved = dict(CAPABILITIES)
    register_capability(STRUCT)
    register_capability(MESSAGE)
    yield
    CAPABILITIES.clear()
    CAPABILITIES.update(saved)


def _request(spec: CapabilitySpec, body: WireModel) -> bytes:
    return encode_request(
        RequestEnvelope(
            request_id="0" * 32,
            caller="operator",
            target=spec.role,
            capability=spec.name,
            body=body,
        )
    )


def test_a_struct_capability_travels_as_a_struct_and_is_validated() -> None:
    data = _request(STRUCT, Rate(text="The storm broke.", scale=5))
    message = pb.AgentRequest.FromString(data)
    assert message.extension.WhichOneof("payload") == "payload_struct"
    assert message.extension.payload_struct["scale"] == 5
    assert decode_request(data).body == Rate(text="The storm broke.", scale=5)
    # A client in another language builds the Struct from a map: a bad value is named by path.
    message.extension.payload_struct["scale"] = 0
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    assert "invalid TestRate request" in caught.value.message
    assert [v.field for v in caught.value.violations] == [
        "scale"
    ]  # relative to the body, as for a built-in one
    # JSON stays accepted for every extension capability.
    message.extension.payload_json = b'{"text": "calm", "scale": 3}'
    assert decode_request(message.SerializeToString()).body == Rate(text="calm", scale=3)


def test_a_message_capability_travels_as_the_users_own_message_in_an_any() -> None:
    data = _request(MESSAGE, AskAbout(entity_id="mira", predicates=["at"]))
    message = pb.AgentRequest.FromString(data)
    packed = message.extension.payload_message
    assert packed.type_url == "type.googleapis.com/appraisal.v1.AppraiseRequest"
    inner = appraisal_pb2.AppraiseRequest()
    assert packed.Unpack(inner)
    assert (inner.entity_id, list(inner.predicates)) == ("mira", ["at"])
    assert decode_request(data).body == AskAbout(entity_id="mira", predicates=["at"])
    answer = encode_response(
        ResponseEnvelope(
            request_id="0" * 32,
            responder="perception",
            capability="TestAppraise",
            body=Appraised(entity_id="mira", facts=1, about=["mira at courtyard"]),
        )
    )
    response = pb.AgentResponse.FromString(answer)
    assert response.extension.payload_message.TypeName() == "appraisal.v1.Appraisal"
    assert decode_response(answer).body == Appraised(
        entity_id="mira", facts=1, about=["mira at courtyard"]
    )


def test_a_wrong_message_type_or_form_is_invalid_argument_naming_the_capability() -> None:
    message = pb.AgentRequest.FromString(_request(MESSAGE, AskAbout(entity_id="mira")))
    wrong = any_pb2.Any()
    wrong.Pack(appraisal_pb2.Appraisal(entity_id="mira"))
    message.extension.payload_message.CopyFrom(wrong)
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    assert caught.value.message == (
        "TestAppraise request: the payload is a 'appraisal.v1.Appraisal', "
        "not 'appraisal.v1.AppraiseRequest'"
    )
    assert caught.value.violations[0].field == "extension.payload_message.type_url"
    message.extension.payload_struct.update({"entity_id": "mira"})
    with pytest.raises(
        InvalidArgumentError, match=r"sent as payload_struct; it travels as message"
    ):
        decode_request(message.SerializeToString())
    # A value the model refuses, sent in the right message, is named by its path.
    message.extension.payload_message.Pack(appraisal_pb2.AppraiseRequest(entity_id=""))
    with pytest.raises(InvalidArgumentError) as caught:
        decode_request(message.SerializeToString())
    assert [v.field for v in caught.value.violations] == ["entity_id"]


def test_describe_shows_how_each_capability_travels() -> None:
    card = CapabilityCard.from_spec(MESSAGE)
    assert (card.wire, card.request_type, card.response_type) == (
        "message",
        "appraisal.v1.AppraiseRequest",
        "appraisal.v1.Appraisal",
    )
    assert '"entity_id"' in card.request_schema
    assert CapabilityCard.from_spec(STRUCT).wire == "struct"
    assert CapabilityCard.from_spec(CAPABILITIES["ExtractEntities"]).wire == "builtin"


class Drifted(WireModel):
    entity_id: str
    weight: float  # no such field in appraisal.v1.AppraiseRequest


def test_a_capability_whose_messages_differ_from_its_models_is_refused() -> None:
    with pytest.raises(ValueError, match=r"capability 'Bad': Drifted and appraisal\.v1\.Appraise"):
        register_capability(
            CapabilitySpec(
                "Bad",
                "perception",
                EXTENSION_FIELD,
                Drifted,
                Appraised,
                wire="message",
                messages=(appraisal_pb2.AppraiseRequest, appraisal_pb2.Appraisal),
            )
        )
    with pytest.raises(ValueError, match="wire 'message' and messages"):
        register_capability(
            CapabilitySpec(
                "Bad", "perception", EXTENSION_FIELD, AskAbout, Appraised, wire="message"
            )
        )
    assert "Bad" not in CAPABILITIES
