"""A capability that answers A2A callers with parts of its choosing (``protocol._a2a._reply``):
what each part becomes, and the parts refused; no sockets."""

from __future__ import annotations

import base64

import pytest
from a2a.types import TaskState
from google.protobuf.json_format import MessageToDict
from pydantic import ValidationError

from stratagem.protocol import A2APart, A2AReply
from stratagem.protocol._a2a._reply import parts_of
from stratagem.protocol._a2a._tasks import task_of


def test_each_part_is_the_a2a_part_it_names() -> None:
    reply = A2AReply(
        parts=[
            A2APart(text="hello", media_type="text/plain"),
            A2APart(data={"snake_key": 1}),
            A2APart(raw=base64.b64encode(b"tck").decode(), filename="o.txt"),
            A2APart(url="https://example.com/o.txt", filename="o.txt", media_type="text/plain"),
        ]
    )
    text, data, raw, url = parts_of(reply)
    assert (text.text, text.media_type) == ("hello", "text/plain")
    assert MessageToDict(data.data) == {"snake_key": 1}  # a free-form object's keys are kept
    assert (raw.raw, raw.filename) == (b"tck", "o.txt")
    assert (url.url, url.filename, url.media_type) == (
        "https://example.com/o.txt",
        "o.txt",
        "text/plain",
    )


def test_a_task_answered_with_a_reply_holds_its_parts_not_its_json() -> None:
    reply = A2AReply(parts=[A2APart(text="Generated text content")])
    task = task_of("t1", "c1", TaskState.TASK_STATE_COMPLETED, skill="Scenario", result=reply)
    assert [part.text for part in task.artifacts[0].parts] == ["Generated text content"]
    assert not task.artifacts[0].parts[0].HasField("data")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({}, "exactly one of"),
        ({"text": "a", "url": "https://example.com/"}, "not text and url"),
        ({"text": "a", "filename": "a.txt"}, "raw or url part only"),
        ({"raw": "not base64!"}, "not base64"),
    ],
)
def test_a_part_that_is_not_one_thing_is_refused(fields: dict[str, str], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        A2APart.model_validate(fields)


def test_a_reply_has_parts() -> None:
    with pytest.raises(ValidationError, match="parts"):
        A2AReply(parts=[])
