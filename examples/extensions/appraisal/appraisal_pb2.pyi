from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class AppraiseRequest(_message.Message):
    __slots__ = ("entity_id", "predicates")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICATES_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    predicates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entity_id: _Optional[str] = ..., predicates: _Optional[_Iterable[str]] = ...) -> None: ...

class Appraisal(_message.Message):
    __slots__ = ("entity_id", "facts", "about")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    ABOUT_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    facts: int
    about: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entity_id: _Optional[str] = ..., facts: _Optional[int] = ..., about: _Optional[_Iterable[str]] = ...) -> None: ...
