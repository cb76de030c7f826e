"""Calling an external A2A agent: the ``SendA2AMessage`` capability and its client.

A plan reaches an agent of another framework with a cross-agent step whose target is ``a2a`` (no
Stratagem agent: the outside world over A2A) and whose capability is ``SendA2AMessage``; its
request names the external agent (``agent``, configured with its URL and credentials) and carries
a text and/or a JSON object. ``A2AAgentClient`` sends it with the A2A SDK's client (``SendMessage``,
JSON-RPC), the step's request id as the message id, so a retried step sends the same message and a
remote that honours message ids answers it once. The answer's task (or message) becomes the
step's output: the task id and state, its text parts and its first JSON object part.

Errors are translated once, here, into ``RemoteError`` classes, so the engine classifies them as
it does a gRPC peer's: a deadline is ``timeout``; an unreachable agent or an HTTP error is
``transient`` (retried); a refused request or a failed task is ``logic``; a refusal of the
credentials is ``policy``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    ClientCallContext,
    ClientConfig,
    create_client,
)
from a2a.types import Message, Part, Role, SendMessageRequest, Task, TaskState
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct
from opentelemetry import propagate
from pydantic import Field

from stratagem.protocol._capabilities import EXTENSION_FIELD, CapabilitySpec, WireModel
from stratagem.protocol._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RemoteError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "A2A_TARGET",
    "SEND_A2A_MESSAGE",
    "A2AAgentClient",
    "A2APeerConfig",
    "A2ASkill",
    "SendA2AMessageRequest",
    "SendA2AMessageResponse",
    "register_a2a_capability",
]

logger = logging.getLogger(__name__)

A2A_TARGET: Final = "a2a"
"""The target a cross-agent step names to reach an external A2A agent."""
_PEER_NAME: Final = r"^[a-z][a-z0-9_-]{0,63}$"


class SendA2AMessageRequest(WireModel):
    """Send one message to an external A2A agent and wait for its answer.

    Attributes:
        agent: The external agent, by the name the settings give it (``STRATAGEM_A2A_AGENTS``).
        skill: The skill asked for (sent as the message's ``skill`` metadata); "" for the agent's
            configured one, if any.
        text: The message's text part ("" for none).
        data: The message's JSON object part (``None`` for none).
    """

    agent: str = Field(pattern=_PEER_NAME)
    skill: str = Field(default="", max_length=200)
    text: str = Field(default="", max_length=64 * 1024)
    data: dict[str, Any] | None = None


class SendA2AMessageResponse(WireModel):
    """What the external agent answered.

    Attributes:
        task_id: Its task's id ("" when it answered with a message).
        state: The task's final state (``completed``, ...), or ``message``.
        text: Its text parts, joined by newlines.
        data: Its first JSON object part (``None`` when it sent none).
    """

    task_id: str = Field(default="", max_length=400)
    state: str = Field(default="", max_length=32)
    text: str = Field(default="", max_length=1 << 20)
    data: dict[str, Any] | None = None


SEND_A2A_MESSAGE: Final = CapabilitySpec(
    "SendA2AMessage",
    A2A_TARGET,
    EXTENSION_FIELD,
    SendA2AMessageRequest,
    SendA2AMessageResponse,
    wire="json",
)


def register_a2a_capability() -> None:
    """Make ``SendA2AMessage`` (target ``a2a``) known, so plans may name it (idempotent)."""
    from stratagem.protocol._capabilities import register_capability

    register_capability(SEND_A2A_MESSAGE)


@dataclass(frozen=True, slots=True)
class A2APeerConfig:
    """One external A2A agent.

    Attributes:
        name: The name steps give it.
        url: Its A2A base URL.
        token: A bearer token it accepts ("" for none): a secret, never logged.
        skill: The skill asked for when a step names none.
        timeout_s: The most one call may take.
        max_answer_bytes: The largest HTTP answer read from it; a larger one fails the call
            (``FAILED_PRECONDITION``) without being read further.
        read_only_skills: Its skills that change nothing; every other skill is taken to have
            side effects (a goal's approval holds it: ``A2ASkill.side_effects``).
    """

    name: str
    url: str
    token: str = field(default="", repr=False)
    skill: str = ""
    timeout_s: float = 60.0
    max_answer_bytes: int = 4 << 20
    read_only_skills: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class A2ASkill:
    """One skill of an external A2A agent's card: its id and the example requests it lists
    (what a goal in plain words is matched against), and whether it may change something: a
    card does not say, so a skill has side effects unless the deployment declared it read-only
    (``A2APeerConfig.read_only_skills``)."""

    skill: str
    examples: tuple[str, ...] = ()
    side_effects: bool = True


_FAILED: Final = {
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_REJECTED: "rejected",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input-required",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth-required",
}


class A2AAgentClient:
    """Sends messages to one external A2A agent (its card resolved on first use).

    Args:
        peer: The agent and its credentials.
    """

    def __init__(self, peer: A2APeerConfig) -> None:
        self.peer = peer
        headers = {"Authorization": f"Bearer {peer.token}"} if peer.token else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=peer.timeout_s,
            transport=_Bounded(httpx.AsyncHTTPTransport(), peer.max_answer_bytes),
        )
        self._client: Any = None
        self._opening = asyncio.Lock()

    async def send(
        self, request: SendA2AMessageRequest, *, message_id: str, timeout_s: float | None
    ) -> SendA2AMessageResponse:
        """Send ``request`` as one message with id ``message_id``; its answer, or the error.

        Raises:
            RemoteError: A subclass per failure (see the module docstring).
        """
        limit = min(timeout_s, self.peer.timeout_s) if timeout_s else self.peer.timeout_s
        message = Message(message_id=message_id, role=Role.ROLE_USER)
        if request.text:
            message.parts.append(Part(text=request.text, media_type="text/plain"))
        if request.data is not None:
            value = Struct()
            ParseDict(request.data, value)
            message.parts.append(Part(media_type="application/json"))
            message.parts[-1].data.struct_value.CopyFrom(value)
        skill = request.skill or self.peer.skill
        if skill:
            message.metadata.update({"skill": skill})
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # the remote joins the step's trace
        try:
            async with asyncio.timeout(limit):
                client = await self._opened()
                answers = [
                    answer
                    async for answer in client.send_message(
                        SendMessageRequest(message=message),
                        context=_context(carrier, limit),
                    )
                ]
        except TimeoutError:
            raise DeadlineExceededError(
                f"{self.peer.name} did not answer within {limit:g} s"
            ) from None
        except A2AClientTimeoutError:
            raise DeadlineExceededError(
                f"{self.peer.name} did not answer within {limit:g} s"
            ) from None
        except (A2AClientError, httpx.HTTPError) as exc:
            if _caused_by(exc, _TooLarge):
                raise FailedPreconditionError(
                    f"{self.peer.name} answered more than {self.peer.max_answer_bytes} bytes"
                ) from None
            raise _transport_error(self.peer.name, exc) from None
        except A2AError as exc:
            raise _refusal(self.peer.name, exc) from None
        if not answers:
            raise UnavailableError(f"{self.peer.name} answered nothing")
        last = answers[-1]
        kind = last.WhichOneof("payload")
        if kind == "message":
            return _from_parts("", "message", list(last.message.parts))
        if kind != "task":
            raise UnavailableError(f"{self.peer.name} answered with {kind!r}, not a task")
        return _from_task(self.peer.name, last.task)

    async def skills(self) -> list[A2ASkill]:
        """The skills its agent card lists (``/.well-known/agent-card.json``), with their
        examples; at most 64 skills and 32 examples each, of at most 200 characters.

        Raises:
            RemoteError: The card cannot be read (a subclass per failure, as for ``send``).
        """
        url = self.peer.url.rstrip("/") + "/.well-known/agent-card.json"
        try:
            # A card is small and quick: an agent that is down costs a goal seconds, not its
            # whole message time limit.
            answer = await self._http.get(url, timeout=min(5.0, self.peer.timeout_s))
            answer.raise_for_status()
            card = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            if _caused_by(exc, _TooLarge):
                raise FailedPreconditionError(
                    f"{self.peer.name}'s card is larger than {self.peer.max_answer_bytes} bytes"
                ) from None
            raise UnavailableError(f"{self.peer.name}'s card could not be read: {exc}") from None
        found = []
        for skill in (card.get("skills") if isinstance(card, dict) else None) or []:
            if not isinstance(skill, dict) or not isinstance(skill.get("id"), str):
                continue
            examples = [e for e in skill.get("examples") or [] if isinstance(e, str)]
            found.append(
                A2ASkill(
                    skill["id"][:64],
                    tuple(e[:200] for e in examples[:32] if e.strip()),
                    side_effects=skill["id"] not in self.peer.read_only_skills,
                )
            )
        return found[:64]

    async def _opened(self) -> Any:
        async with self._opening:
            if self._client is None:
                self._client = await create_client(
                    self.peer.url,
                    client_config=ClientConfig(streaming=False, httpx_client=self._http),
                )
            return self._client

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        await self._http.aclose()


class _TooLarge(httpx.TransportError):
    """An answer past the peer's ``max_answer_bytes``."""


class _Bounded(httpx.AsyncBaseTransport):
    """A transport whose answers are cut off (``_TooLarge``) past ``limit`` bytes, so a peer
    cannot make the agent hold an answer of any size."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise _TooLarge(f"the answer is {declared} bytes", request=request)
        response.stream = _Capped(response.stream, self._limit, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Capped(httpx.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, request: httpx.Request) -> None:
        self._inner = inner
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise _TooLarge(f"the answer passed {self._limit} bytes", request=self._request)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _context(carrier: dict[str, str], timeout_s: float) -> ClientCallContext:
    """The SDK's call context: W3C trace headers (sent as service parameters) and the deadline."""
    return ClientCallContext(service_parameters=dict(carrier), timeout=timeout_s)


def _from_task(name: str, task: Task) -> SendA2AMessageResponse:
    state = task.status.state
    if state in _FAILED:
        said = " ".join(p.text for p in task.status.message.parts if p.text)[:500]
        raise FailedPreconditionError(
            f"{name}'s task {task.id} ended {_FAILED[state]}" + (f": {said}" if said else "")
        )
    parts = [part for artifact in task.artifacts for part in artifact.parts]
    if not parts:
        parts = list(task.status.message.parts)
    label = TaskState.Name(state).removeprefix("TASK_STATE_").lower()
    return _from_parts(task.id, label, parts)


def _from_parts(task_id: str, state: str, parts: list[Part]) -> SendA2AMessageResponse:
    texts = [part.text for part in parts if part.WhichOneof("content") == "text"]
    data = None
    for part in parts:
        if part.WhichOneof("content") == "data":
            value = MessageToDict(part.data)
            if isinstance(value, dict):
                data = value
                break
    return SendA2AMessageResponse(task_id=task_id, state=state, text="\n".join(texts), data=data)


def _refusal(name: str, error: A2AError) -> RemoteError:
    message = f"{name}: {error.message}"
    if isinstance(
        error,
        InvalidParamsError
        | InvalidRequestError
        | MethodNotFoundError
        | ContentTypeNotSupportedError
        | UnsupportedOperationError,
    ):
        return InvalidArgumentError(message)
    if isinstance(error, TaskNotFoundError):
        return NotFoundError(message)
    return FailedPreconditionError(message)


def _transport_error(name: str, error: Exception) -> RemoteError:
    text = str(error)
    if "401" in text:
        return UnauthenticatedError(f"{name} refused the credentials")
    if "403" in text:
        return PermissionDeniedError(f"{name} refused the call")
    return UnavailableError(f"{name} is unreachable: {type(error).__name__}: {text[:300]}")
