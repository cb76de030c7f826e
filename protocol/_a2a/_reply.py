"""A capability's answer shaped for A2A: the parts of its artifact, or a message instead of a task.

An agent's A2A face answers a capability with a task whose artifact is one data part, the
response's JSON. A capability whose response model is ``A2AReply`` (or a subclass) chooses its
parts instead: text, a JSON object, a file's bytes or a file's URL, each with its media type and
file name; with ``message=True`` a non-streaming ``SendMessage`` is answered with a message
holding those parts, not with a task (the plan still ran: ``GetTask`` finds it). Over gRPC the
response is the model's JSON like any other.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Self

from a2a.types import Part
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value
from pydantic import Field, field_validator, model_validator

from stratagem.protocol._capabilities import WireModel

__all__ = ["A2APart", "A2AReply", "parts_of"]

_TEXT_BYTES = 1 << 20


class A2APart(WireModel):
    """One part of an A2A answer: exactly one of ``text``, ``data``, ``raw`` or ``url``.

    Attributes:
        text: A text part.
        data: A data part holding this JSON object (its keys kept as they are).
        raw: A file's bytes, base64-encoded.
        url: A file's URL.
        filename: The file's name (a ``raw`` or ``url`` part only).
        media_type: The part's media type (``text/plain``, ...).
    """

    text: str | None = Field(default=None, max_length=_TEXT_BYTES)
    data: dict[str, Any] | None = None
    raw: str | None = Field(default=None, max_length=_TEXT_BYTES)
    url: str | None = Field(default=None, max_length=2048)
    filename: str = Field(default="", max_length=256)
    media_type: str = Field(default="", max_length=128)

    @field_validator("raw")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("is not base64") from None
        return value

    @model_validator(mode="after")
    def _one_content(self) -> Self:
        given = [name for name in ("text", "data", "raw", "url") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "a part holds exactly one of text, data, raw or url"
                + (f", not {' and '.join(given)}" if given else "")
            )
        if self.filename and given[0] not in ("raw", "url"):
            raise ValueError("filename names a file: a raw or url part only")
        return self


class A2AReply(WireModel):
    """A capability's answer as A2A parts (a response model for capabilities that answer A2A
    callers in text or files rather than JSON).

    Attributes:
        parts: The parts of the task's artifact (or of the message).
        message: Answer a non-streaming ``SendMessage`` with a message holding the parts, not a
            task.
    """

    parts: list[A2APart] = Field(min_length=1, max_length=64)
    message: bool = False


def parts_of(reply: A2AReply) -> list[Part]:
    """The A2A parts of ``reply``."""
    parts = []
    for part in reply.parts:
        made = Part(filename=part.filename, media_type=part.media_type)
        if part.text is not None:
            made.text = part.text
        elif part.data is not None:
            made.data.CopyFrom(ParseDict(part.data, Value()))
        elif part.raw is not None:
            made.raw = base64.b64decode(part.raw)
        elif part.url is not None:
            made.url = part.url
        parts.append(made)
    return parts
