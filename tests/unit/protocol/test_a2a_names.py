"""A capability's JSON in A2A data parts (``protocol._a2a._names``): ProtoJSON's lowerCamelCase
names out, snake_case or lowerCamelCase in; a free-form object's keys are data, never renamed."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types import Message, Part, Role, TaskState
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from pydantic import Field

from stratagem.protocol import (
    CAPABILITIES,
    FindSpatialContextResponse,
    Relation,
    SpatialContext,
    WireModel,
)
from stratagem.protocol._a2a._names import (
    NameClashError,
    from_proto_json,
    json_name,
    to_proto_json,
)
from stratagem.protocol._a2a._tasks import request_body, task_of

SPATIAL = CAPABILITIES["FindSpatialContext"]


class Inner(WireModel):
    entity_id: str
    world_version: int = 0


class Outer(WireModel):
    entity_ids: list[str] = Field(default_factory=list)
    inner_items: list[Inner] = Field(default_factory=list)
    by_key: dict[str, Inner] = Field(default_factory=dict)
    free_form: dict[str, Any] = Field(default_factory=dict)
    maybe_inner: Inner | None = None
    pair: tuple[Inner, int] | None = None


def _data_message(value: dict[str, Any]) -> Message:
    struct = Struct()
    struct.update(value)
    part = Part()
    part.data.struct_value.CopyFrom(struct)
    return Message(message_id="m1", role=Role.ROLE_USER, parts=[part])


def test_json_names_are_protocs() -> None:
    assert json_name("entity_ids") == "entityIds"
    assert json_name("world_version") == "worldVersion"
    assert json_name("x_2") == "x2"
    assert json_name("text") == "text"


def test_a_models_fields_are_rendered_with_proto_json_names_and_free_keys_are_kept() -> None:
    value = Outer(
        entity_ids=["mira"],
        inner_items=[Inner(entity_id="mira", world_version=3)],
        by_key={"snake_key": Inner(entity_id="a")},
        free_form={"snake_key": {"nested_key": 1}},
        maybe_inner=Inner(entity_id="b"),
        pair=(Inner(entity_id="c"), 2),
    )
    assert to_proto_json(value) == {
        "entityIds": ["mira"],
        "innerItems": [{"entityId": "mira", "worldVersion": 3}],
        "byKey": {"snake_key": {"entityId": "a", "worldVersion": 0}},
        "freeForm": {"snake_key": {"nested_key": 1}},
        "maybeInner": {"entityId": "b", "worldVersion": 0},
        "pair": [{"entityId": "c", "worldVersion": 0}, 2],
    }


def test_both_spellings_are_accepted_and_give_the_same_model() -> None:
    camel = {
        "entityIds": ["mira"],
        "innerItems": [{"entityId": "mira", "worldVersion": 3}],
        "byKey": {"snake_key": {"entityId": "a"}},
        "freeForm": {"snake_key": {"nestedKey": 1}},
        "maybeInner": {"entity_id": "b"},
        "pair": [{"entityId": "c"}, 2],
    }
    snake = {
        "entity_ids": ["mira"],
        "inner_items": [{"entity_id": "mira", "world_version": 3}],
        "by_key": {"snake_key": {"entity_id": "a"}},
        "free_form": {"snake_key": {"nestedKey": 1}},
        "maybe_inner": {"entity_id": "b"},
        "pair": [{"entity_id": "c"}, 2],
    }
    assert from_proto_json(camel, Outer) == snake
    assert Outer.model_validate(from_proto_json(camel, Outer)) == Outer.model_validate(snake)
    # What the agent renders, it reads back.
    model = Outer.model_validate(snake)
    assert Outer.model_validate(from_proto_json(to_proto_json(model), Outer)) == model


def test_one_field_in_both_spellings_is_refused_naming_it() -> None:
    with pytest.raises(NameClashError) as caught:
        from_proto_json({"inner_items": [{"entity_id": "a", "entityId": "b"}]}, Outer)
    assert caught.value.field == "inner_items.0.entity_id"


def test_a_data_part_names_the_requests_fields_either_way() -> None:
    camel = request_body(_data_message({"entityIds": ["mira"]}), SPATIAL)
    snake = request_body(_data_message({"entity_ids": ["mira"]}), SPATIAL)
    assert camel == snake
    assert camel.model_dump(exclude_defaults=True) == {"entity_ids": ["mira"]}
    with pytest.raises(InvalidParamsError) as caught:
        request_body(_data_message({"entityIds": ["a"], "entity_ids": ["b"]}), SPATIAL)
    assert caught.value.data is not None
    assert caught.value.data["violations"][0]["field"] == "entity_ids"
    # A violation still names the field (in the model's spelling) whatever the spelling sent.
    with pytest.raises(InvalidParamsError) as caught:
        request_body(_data_message({"entityIds": []}), SPATIAL)
    assert caught.value.data is not None
    assert caught.value.data["violations"][0]["field"] == "entity_ids"


def test_the_answers_data_part_holds_the_response_under_proto_json_names() -> None:
    response = FindSpatialContextResponse(
        contexts=[SpatialContext(entity_id="mira", location="courtyard")],
        facts=[Relation(subject="mira", predicate="at", object="courtyard")],
    )
    task = task_of("t1", "c1", TaskState.TASK_STATE_COMPLETED, skill=SPATIAL.name, result=response)
    data = MessageToDict(task.artifacts[0].parts[0].data)
    assert data["contexts"][0]["entityId"] == "mira"
    assert "entity_id" not in data["contexts"][0]
    # And the request it answers reads the same JSON back, in either spelling.
    assert SPATIAL.response.model_validate(from_proto_json(data, SPATIAL.response)) == response
