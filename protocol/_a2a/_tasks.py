"""What A2A's words mean in Stratagem's: messages to capability requests, plans to tasks, errors.

A task is the plan that serves the request: its id is the plan's id, and the same message from
the same caller always names the same task (``task_id_for``), so a repeated ``SendMessage`` is
answered from the agent's answer store instead of running again. A message names the skill
(capability) it asks for in its metadata (``"skill"``); without one, the first skill of the card is
meant. Its body is the first data part holding a JSON object (the capability's request as JSON,
its fields named in snake_case or ProtoJSON's lowerCamelCase), or else its text, which fills the
request's one required text field when it has exactly one. The answer's data part holds the
response's JSON under ProtoJSON names (``_names.py``), unless the response is an ``A2AReply``.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from typing import Any, Final

from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value
from pydantic import ValidationError

from stratagem.protocol._a2a._names import NameClashError, from_proto_json, to_proto_json
from stratagem.protocol._a2a._reply import A2AReply, parts_of
from stratagem.protocol._capabilities import CapabilitySpec, WireModel
from stratagem.protocol._codec import violations_from
from stratagem.protocol._errors import Code, InvalidArgumentError, RemoteError
from stratagem.protocol._models import REQUEST_ID_PATTERN

__all__ = [
    "FINAL_STATES",
    "SKILL_KEY",
    "TaskBook",
    "a2a_error",
    "failed_task",
    "request_body",
    "request_id_for",
    "result_parts",
    "skill_of",
    "state_of",
    "task_id_for",
    "task_of",
    "value_of",
]

SKILL_KEY: Final = "skill"
"""The message metadata key naming the capability asked for."""
JSON_MEDIA: Final = "application/json"
TEXT_MEDIA: Final = "text/plain"

_REQUEST_ID: Final = re.compile(REQUEST_ID_PATTERN)
_STATES: Final[dict[str, TaskState]] = {
    "pending": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "blocked": TaskState.TASK_STATE_INPUT_REQUIRED,
    "paused": TaskState.TASK_STATE_INPUT_REQUIRED,
    "succeeded": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
FINAL_STATES: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def task_id_for(caller: str, message_id: str) -> str:
    """The task (and plan) id of a caller's message: the same message, the same task."""
    return "a2a-" + hashlib.sha256(f"{caller}\0{message_id}".encode()).hexdigest()[:32]


def request_id_for(message_id: str) -> str:
    """The request id (idempotency key) of a message: its id, or a digest of an unusual one."""
    candidate = f"a2a:{message_id}"
    if len(candidate) <= 200 and _REQUEST_ID.fullmatch(candidate):
        return candidate
    return "a2a:" + hashlib.sha256(message_id.encode()).hexdigest()[:40]


def state_of(status: str) -> TaskState:
    """The A2A task state of a plan status."""
    return _STATES.get(status, TaskState.TASK_STATE_WORKING)


def skill_of(message: Message, skills: list[str]) -> str:
    """The capability a message asks for: its metadata's ``skill``, else the first one.

    Raises:
        InvalidParamsError: The metadata names a skill this agent does not have.
    """
    named = message.metadata.fields.get(SKILL_KEY)
    if named is None:
        if not skills:
            raise UnsupportedOperationError(message="this agent serves no skill")
        return skills[0]
    skill = named.string_value
    if skill not in skills:
        raise InvalidParamsError(
            message=f"unknown skill {skill[:64]!r}; this agent's skills: {', '.join(skills)}"
        )
    return skill


def value_of(message: Message) -> Any:
    """The value a message gives a gate that asks: its first data part's JSON, else its text
    parts joined by newlines.

    Raises:
        ContentTypeNotSupportedError: A file part (raw bytes or a URL).
        InvalidParamsError: No data part and no text.
    """
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind in ("raw", "url"):
            raise ContentTypeNotSupportedError(
                message="file parts are not accepted: send a data part (JSON) or text"
            )
        if kind == "data":
            return MessageToDict(part.data)
        if kind == "text":
            texts.append(part.text)
    if not texts:
        raise InvalidParamsError(message="the answer needs a data part (JSON) or text")
    return "\n".join(texts)


def request_body(message: Message, spec: CapabilitySpec) -> WireModel:
    """The capability request a message carries, validated by the capability's model.

    Raises:
        ContentTypeNotSupportedError: A file part (raw bytes or a URL).
        InvalidParamsError: No usable part, or a request that breaks the model (its field
            violations in the error's data).
    """
    data: dict[str, Any] | None = None
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind in ("raw", "url"):
            raise ContentTypeNotSupportedError(
                message="file parts are not accepted: send a data part (JSON) or text"
            )
        if kind == "data" and data is None:
            value = MessageToDict(part.data)
            if isinstance(value, dict):
                data = value
        elif kind == "text":
            texts.append(part.text)
    if data is None:
        field = _text_field(spec)
        if field is None or not texts:
            raise InvalidParamsError(
                message=f"{spec.name} takes a data part holding its request as a JSON object"
            )
        data = {field: "\n".join(texts)}
    try:
        return spec.request.model_validate(from_proto_json(data, spec.request))
    except NameClashError as exc:
        raise InvalidParamsError(
            message=f"{spec.name}: invalid request",
            data={"violations": [{"field": exc.field, "description": exc.description}]},
        ) from None
    except ValidationError as exc:
        violations = violations_from(exc)
        raise InvalidParamsError(
            message=f"{spec.name}: invalid request",
            data={
                "violations": [{"field": v.field, "description": v.description} for v in violations]
            },
        ) from None


def _text_field(spec: CapabilitySpec) -> str | None:
    """The request model's one required text field, if it has exactly one."""
    required = [
        name
        for name, field in spec.request.model_fields.items()
        if field.is_required() and field.annotation is str
    ]
    return required[0] if len(required) == 1 else None


def task_of(
    task_id: str,
    context_id: str,
    state: TaskState,
    *,
    note: str = "",
    skill: str = "",
    result: WireModel | None = None,
    history: list[Message] | None = None,
    at: float = 0.0,
) -> Task:
    """A task in ``state``, with its result as a data artifact when it has one; ``at``: when
    the state began, seconds since the epoch (0: now)."""
    status = TaskStatus(state=state)
    if at > 0:
        status.timestamp.FromNanoseconds(int(at * 1e9))
    else:
        status.timestamp.GetCurrentTime()
    if note:
        status.message.CopyFrom(
            Message(
                message_id=f"{task_id}:status",
                context_id=context_id,
                task_id=task_id,
                role=Role.ROLE_AGENT,
                parts=[Part(text=note, media_type=TEXT_MEDIA)],
            )
        )
    task = Task(id=task_id, context_id=context_id, status=status, history=history or [])
    if result is not None:
        task.artifacts.append(
            Artifact(
                artifact_id=f"{task_id}:result", name=skill or "result", parts=result_parts(result)
            )
        )
    return task


def result_parts(result: WireModel) -> list[Part]:
    """A capability's response as A2A parts: those an ``A2AReply`` chooses, else one data part
    holding its JSON under ProtoJSON's (lowerCamelCase) names."""
    if isinstance(result, A2AReply):
        return parts_of(result)
    return [Part(data=ParseDict(to_proto_json(result), Value()), media_type=JSON_MEDIA)]


def failed_task(task_id: str, context_id: str, error: RemoteError, history: list[Message]) -> Task:
    """The task of a request whose plan ran and failed (or was cancelled)."""
    state = (
        TaskState.TASK_STATE_CANCELED
        if error.code is Code.CANCELLED
        else TaskState.TASK_STATE_FAILED
    )
    return task_of(
        task_id, context_id, state, note=f"{error.code}: {error.message}", history=history
    )


# Codes that refuse a request before its plan exists: JSON-RPC errors, not failed tasks.
_REFUSALS: Final = frozenset(
    {
        Code.INVALID_ARGUMENT,
        Code.UNAUTHENTICATED,
        Code.PERMISSION_DENIED,
        Code.NOT_FOUND,
        Code.RESOURCE_EXHAUSTED,
        Code.UNIMPLEMENTED,
    }
)


def is_refusal(error: RemoteError) -> bool:
    """Whether ``error`` refused the request before anything ran (an error, not a task)."""
    return error.code in _REFUSALS


def a2a_error(error: RemoteError, *, task_id: str = "") -> A2AError:
    """The A2A (JSON-RPC) error standing for a Stratagem one (``protocol._status`` for gRPC)."""
    message = error.message
    match error.code:
        case Code.INVALID_ARGUMENT:
            data = None
            if isinstance(error, InvalidArgumentError) and error.violations:
                data = {
                    "violations": [
                        {"field": v.field, "description": v.description} for v in error.violations
                    ]
                }
            return InvalidParamsError(message=message, data=data)
        case Code.NOT_FOUND if task_id:
            return TaskNotFoundError(message=f"no task {task_id!r} on this agent")
        case Code.NOT_FOUND:
            return InvalidParamsError(message=message)
        case Code.FAILED_PRECONDITION if task_id:
            return TaskNotCancelableError(message=message)
        case Code.FAILED_PRECONDITION:
            return InvalidRequestError(message=message)
        case Code.UNAUTHENTICATED | Code.PERMISSION_DENIED:
            return InvalidRequestError(message=message, data={"code": error.code.value})
        case Code.RESOURCE_EXHAUSTED:
            return InvalidRequestError(message=message, data={"code": error.code.value})
        case _:
            return InternalError(message=f"{error.code}: {message}")


class TaskBook:
    """The latest tasks this agent answered over A2A, by id, with who asked: their artifacts and
    history, which a plan snapshot does not carry (``GetTask``), and the list ``ListTasks`` shows
    a caller (its own tasks only). Bounded: the oldest are forgotten first; a forgotten task is
    still found by ``GetTask`` (from its plan), without its artifacts. Who owns a task is kept
    longer (``owners_kept``, a few dozen bytes each): ``GetTask``, ``CancelTask`` and
    ``SubscribeToTask`` answer "not found" to anyone else."""

    def __init__(self, limit: int = 1024, *, owners_kept: int | None = None) -> None:
        self._limit = limit
        self._owners_kept = owners_kept if owners_kept is not None else 16 * limit
        self._tasks: OrderedDict[str, tuple[str, Task]] = OrderedDict()
        self._owners: OrderedDict[str, str] = OrderedDict()

    def keep(self, task: Task, owner: str | None = None) -> None:
        """Remember ``task`` (``owner``: who asked; ``None`` keeps the one known)."""
        known = self._tasks.get(task.id)
        who = owner if owner is not None else (known[0] if known is not None else "")
        self._tasks[task.id] = (who, task)
        self._tasks.move_to_end(task.id)
        while len(self._tasks) > self._limit:
            self._tasks.popitem(last=False)
        if owner:
            self._owners[task.id] = owner
            self._owners.move_to_end(task.id)
            while len(self._owners) > self._owners_kept:
                self._owners.popitem(last=False)

    def owner(self, task_id: str) -> str | None:
        """Who asked for ``task_id`` (``None``: not known here, or forgotten)."""
        return self._owners.get(task_id)

    def get(self, task_id: str) -> Task | None:
        kept = self._tasks.get(task_id)
        return kept[1] if kept is not None else None

    def owned_by(self, owner: str) -> list[Task]:
        """``owner``'s tasks, the most recently updated first."""
        mine = [task for who, task in self._tasks.values() if who == owner]
        mine.sort(key=lambda task: task.status.timestamp.ToNanoseconds(), reverse=True)
        return mine
