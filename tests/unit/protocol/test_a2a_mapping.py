"""A2A's words in Stratagem's (``protocol._a2a``): messages to requests, plans to tasks, errors, the
card; no sockets."""

from __future__ import annotations

import pytest
from a2a.types import Message, Part, Role, TaskState
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf.struct_pb2 import Struct

from stratagem.agents import build_agent
from stratagem.protocol import (
    CAPABILITIES,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from stratagem.protocol._a2a import a2a_card
from stratagem.protocol._a2a._tasks import (
    TaskBook,
    a2a_error,
    request_body,
    request_id_for,
    skill_of,
    state_of,
    task_id_for,
    task_of,
)

EXTRACT = CAPABILITIES["ExtractEntities"]
SPATIAL = CAPABILITIES["FindSpatialContext"]


def _message(*parts: Part, skill: str | None = None) -> Message:
    message = Message(message_id="m1", role=Role.ROLE_USER, parts=list(parts))
    if skill is not None:
        message.metadata.update({"skill": skill})
    return message


def _data(value: dict[str, object]) -> Part:
    struct = Struct()
    struct.update(value)
    part = Part()
    part.data.struct_value.CopyFrom(struct)
    return part


def test_the_same_message_from_the_same_caller_is_the_same_task() -> None:
    assert task_id_for("operator", "m1") == task_id_for("operator", "m1")
    assert task_id_for("operator", "m1") != task_id_for("reader", "m1")
    assert task_id_for("operator", "m1").startswith("a2a-")


def test_request_ids_keep_a_plain_message_id_and_digest_an_odd_one() -> None:
    assert request_id_for("0f3e-22") == "a2a:0f3e-22"
    odd = request_id_for("white space & ünicode")
    assert odd.startswith("a2a:")
    assert " " not in odd


def test_text_fills_the_one_required_text_field() -> None:
    body = request_body(_message(Part(text="Mira is a knight.")), EXTRACT)
    assert body.model_dump(exclude_defaults=True) == {"text": "Mira is a knight."}


def test_a_data_part_is_the_request_and_its_violations_are_named() -> None:
    body = request_body(_message(_data({"entity_ids": ["mira"]})), SPATIAL)
    assert body.model_dump(exclude_defaults=True) == {"entity_ids": ["mira"]}
    with pytest.raises(InvalidParamsError) as caught:
        request_body(_message(_data({"entity_ids": []})), SPATIAL)
    assert caught.value.data is not None
    assert caught.value.data["violations"][0]["field"] == "entity_ids"


def test_text_cannot_fill_a_request_without_one_text_field() -> None:
    with pytest.raises(InvalidParamsError, match="data part"):
        request_body(_message(Part(text="mira")), SPATIAL)


def test_file_parts_are_not_accepted() -> None:
    with pytest.raises(ContentTypeNotSupportedError):
        request_body(_message(Part(url="file:///etc/passwd")), EXTRACT)


def test_the_skill_is_named_in_the_metadata_or_is_the_first() -> None:
    skills = ["ExtractEntities", "FindSpatialContext"]
    assert skill_of(_message(), skills) == "ExtractEntities"
    assert skill_of(_message(skill="FindSpatialContext"), skills) == "FindSpatialContext"
    with pytest.raises(InvalidParamsError, match="unknown skill"):
        skill_of(_message(skill="LaunchRockets"), skills)


def test_plan_statuses_are_task_states() -> None:
    assert state_of("succeeded") == TaskState.TASK_STATE_COMPLETED
    assert state_of("failed") == TaskState.TASK_STATE_FAILED
    assert state_of("cancelled") == TaskState.TASK_STATE_CANCELED
    assert state_of("blocked") == TaskState.TASK_STATE_INPUT_REQUIRED
    assert state_of("running") == TaskState.TASK_STATE_WORKING


def test_errors_map_to_the_codes_the_spec_names() -> None:
    violations = (FieldViolation("text", "too long"),)
    invalid = a2a_error(InvalidArgumentError("bad", violations=violations))
    assert isinstance(invalid, InvalidParamsError)
    assert invalid.data == {"violations": [{"field": "text", "description": "too long"}]}
    assert isinstance(a2a_error(NotFoundError("no plan"), task_id="t"), TaskNotFoundError)
    assert isinstance(
        a2a_error(FailedPreconditionError("done"), task_id="t"), TaskNotCancelableError
    )
    denied = a2a_error(PermissionDeniedError("no"))
    assert isinstance(denied, InvalidRequestError)
    assert denied.data == {"code": "PERMISSION_DENIED"}
    assert isinstance(a2a_error(DeadlineExceededError("slow")), InternalError)


def test_the_task_book_is_bounded_and_lists_a_callers_own_tasks_newest_first() -> None:
    book = TaskBook(limit=2)
    for index, owner in enumerate(("a", "b", "a")):
        book.keep(task_of(f"t{index}", "c", TaskState.TASK_STATE_COMPLETED), owner)
    assert book.get("t0") is None  # the oldest is forgotten
    assert [task.id for task in book.owned_by("a")] == ["t2"]
    assert [task.id for task in book.owned_by("b")] == ["t1"]


def test_the_task_book_remembers_owners_longer_than_tasks() -> None:
    book = TaskBook(limit=1, owners_kept=2)
    for index, owner in enumerate(("a", "b", "c")):
        book.keep(task_of(f"t{index}", "c", TaskState.TASK_STATE_COMPLETED), owner)
    assert book.get("t1") is None
    assert (book.owner("t0"), book.owner("t1"), book.owner("t2")) == (None, "b", "c")
    book.keep(task_of("t3", "c", TaskState.TASK_STATE_CANCELED))  # who asked is not known
    assert book.owner("t3") is None


def test_the_card_has_a_skill_per_capability_and_the_bearer_scheme() -> None:
    agent = build_agent("perception")
    card = a2a_card(agent.card(), "http://127.0.0.1:1/", auth_mode="token")
    assert [skill.id for skill in card.skills] == [c.name for c in agent.card().capabilities]
    scheme = card.security_schemes["bearer"].http_auth_security_scheme
    assert (scheme.scheme, scheme.bearer_format) == ("Bearer", "JWT")
    open_card = a2a_card(agent.card(), "http://127.0.0.1:1/", auth_mode="none")
    assert not open_card.security_schemes
