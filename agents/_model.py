"""Model clients: what a model-backed planner asks a language model through.

``ModelClient`` is the seam: one async ``chat`` call with the messages, a token limit and,
optionally, a JSON Schema the answer must follow (``response_format``, for constrained decoding).
Two implementations ship:

* ``OpenAIModelClient``: the OpenAI-compatible Chat Completions API at any base URL (vLLM, Ollama,
  llama.cpp's server, LM Studio, OpenAI), through the ``openai`` library (the ``model`` extra);
* ``ScriptedModelClient``: answers from a script and records every request, for unit tests (ours
  and users'), in the spirit of httpx's ``MockTransport``.

Failures are the engine's failure classes: a server that cannot be reached, times out, limits the
rate or fails (5xx) raises ``TransientError`` (retried with backoff); a request the server refuses
(4xx) raises ``LogicError``. An answer the model declined to give (a refusal, or one the
server's content filter withheld) is an answer, not a failure of the call: ``parse_json_answer``
turns it into the critique a planner sends back. The API key is a secret: it is kept out of every
``repr`` and message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stratagem.planning import LogicError, TransientError

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "ModelClient",
    "ModelConfig",
    "OpenAIModelClient",
    "ScriptedModelClient",
    "parse_json_answer",
    "response_format",
]

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a planner asks a model.

    Attributes:
        messages: The conversation, oldest first.
        max_tokens: The most tokens the answer may have (also what a budget reserves).
        temperature: Sampling temperature; 0 for the most likely answer.
        schema: A JSON Schema the answer must follow (sent as ``response_format``), or ``None``.
        schema_name: The schema's name in ``response_format``.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int = 512
    temperature: float = 0.0
    schema: Mapping[str, Any] | None = None
    schema_name: str = "plan"


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """What the model answered, and what it cost.

    Attributes:
        content: The answer's text (JSON when a schema was asked for).
        model: The model that answered, as the server names it.
        finish_reason: ``stop``, ``length`` (cut at ``max_tokens``), ``content_filter``, ...;
            ``refusal`` when the model declined to answer (``content`` is then its reason, as the
            API's ``message.refusal`` gave it).
        input_tokens: Tokens of the prompt, as the server counted them.
        output_tokens: Tokens of the answer.
        latency_s: Wall time of the call.
    """

    content: str
    model: str
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0


class ModelClient(Protocol):
    """A language model behind one call."""

    @property
    def model(self) -> str:
        """The model asked for."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """Ask once; raise ``TransientError`` or ``LogicError`` when it fails."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Where the model is and how long to wait for it.

    Attributes:
        url: The OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8089/v1``.
        model: The model's name at that server.
        api_key: The key, a secret (never in a repr, a log line, a span or the audit log).
        timeout_s: How long one call may take.
        schema_style: How the server takes a JSON Schema: ``json_schema`` (OpenAI's
            ``{"type": "json_schema", "json_schema": {...}}``: OpenAI, vLLM, Ollama, LM Studio) or
            ``json_object`` (``{"type": "json_object", "schema": {...}}``: llama-cpp-python's
            server, which refuses the other).
        max_concurrent: Calls this client has in flight at once; more wait their turn before
            they are sent (their ``timeout_s`` starts when they are). A CPU server answers one
            at a time: calls it would queue would time out there instead.
    """

    url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_s: float = 60.0
    schema_style: Literal["json_schema", "json_object"] = "json_schema"
    max_concurrent: int = 4

    def __repr__(self) -> str:
        key = "<set>" if self.api_key else "<none>"
        return f"ModelConfig(url={self.url!r}, model={self.model!r}, api_key={key})"


def response_format(
    request: ChatRequest, style: Literal["json_schema", "json_object"] = "json_schema"
) -> dict[str, Any] | None:
    """The ``response_format`` argument for ``request``'s schema (``None`` without one), in the
    server's ``style`` (see ``ModelConfig.schema_style``)."""
    if request.schema is None:
        return None
    if style == "json_object":
        return {"type": "json_object", "schema": dict(request.schema)}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": request.schema_name,
            "schema": dict(request.schema),
            "strict": True,
        },
    }


class OpenAIModelClient:
    """A model behind the OpenAI-compatible Chat Completions API (the ``openai`` library).

    Args:
        config: Where the model is.
        http_client: An ``httpx2.AsyncClient`` (openai 3's HTTP library) to send with: proxies,
            custom certificates, or a test's ``httpx2.MockTransport``; the library's own when
            ``None``.

    Raises:
        ModuleNotFoundError: The ``openai`` library is missing (``pip install 'stratagem[model]'``).
    """

    def __init__(self, config: ModelConfig, *, http_client: Any = None) -> None:
        try:
            import openai
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "model planning needs the openai library: pip install 'stratagem[model]'",
                name="openai",
            ) from exc
        self._openai = openai
        self._config = config
        self._turns = asyncio.Semaphore(max(1, config.max_concurrent))
        # max_retries=0: retries are the engine's business (backoff, budgets, the journal).
        self._client = openai.AsyncOpenAI(
            base_url=config.url,
            api_key=config.api_key or "none",
            timeout=config.timeout_s,
            max_retries=0,
            http_client=http_client,
        )

    def __repr__(self) -> str:
        return f"OpenAIModelClient({self._config!r})"

    @property
    def model(self) -> str:
        return self._config.model

    async def chat(self, request: ChatRequest) -> ChatResponse:
        arguments: dict[str, Any] = {
            "model": self._config.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        fmt = response_format(request, self._config.schema_style)
        if fmt is not None:
            arguments["response_format"] = fmt
        async with self._turns:
            return await self._send(arguments)

    async def _send(self, arguments: dict[str, Any]) -> ChatResponse:
        openai = self._openai
        started = time.perf_counter()
        try:
            completion = await self._client.chat.completions.create(**arguments)
        except openai.APITimeoutError as exc:  # before its base class, APIConnectionError
            raise TransientError(
                f"model server {self._config.url} did not answer within "
                f"{self._config.timeout_s:g} s"
            ) from exc
        except openai.APIConnectionError as exc:
            raise TransientError(
                f"model server {self._config.url} unreachable: {type(exc).__name__}"
            ) from exc
        except openai.RateLimitError as exc:
            raise TransientError(
                f"model server {self._config.url} answered 429: rate limited"
            ) from exc
        except openai.APIStatusError as exc:
            what = f"model server {self._config.url} answered {exc.status_code}"
            if exc.status_code >= 500:
                raise TransientError(what) from exc
            raise LogicError(f"{what}: the request was refused") from exc
        latency = time.perf_counter() - started
        if not completion.choices:
            raise LogicError(f"model server {self._config.url} answered no choice")
        choice = completion.choices[0]
        usage = completion.usage
        refusal = getattr(choice.message, "refusal", None)
        return ChatResponse(
            content=str(refusal) if refusal else choice.message.content or "",
            model=completion.model or self._config.model,
            finish_reason="refusal" if refusal else str(choice.finish_reason or "unknown"),
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            latency_s=latency,
        )


Scripted = str | ChatResponse | BaseException | Callable[[ChatRequest], "str | ChatResponse"]


class ScriptedModelClient:
    """A model that answers from a script, in order, and records every request.

    Each entry is the answer's text, a whole ``ChatResponse``, an exception to raise, or a function
    of the request returning either. Running past the script is a ``LogicError``.

    Args:
        script: The answers.
        model: The name it reports.
        tokens_per_char: How text is counted as tokens in the responses it makes (a rough 1/4).
    """

    def __init__(
        self,
        script: Iterable[Scripted],
        *,
        model: str = "scripted",
        tokens_per_char: float = 0.25,
    ) -> None:
        self._script: deque[Scripted] = deque(script)
        self._model = model
        self._ratio = tokens_per_char
        self.requests: list[ChatRequest] = []

    @property
    def model(self) -> str:
        return self._model

    @property
    def remaining(self) -> int:
        """Answers not given yet."""
        return len(self._script)

    def _tokens(self, text: str) -> int:
        return max(1, round(len(text) * self._ratio))

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if not self._script:
            raise LogicError(f"scripted model {self._model!r} has no answer left")
        entry = self._script.popleft()
        if isinstance(entry, BaseException):
            raise entry
        answer = entry(request) if callable(entry) else entry
        if isinstance(answer, ChatResponse):
            return answer
        prompt = "".join(m.content for m in request.messages)
        return ChatResponse(
            content=answer,
            model=self._model,
            finish_reason="stop",
            input_tokens=self._tokens(prompt),
            output_tokens=self._tokens(answer),
        )


def parse_json_answer(response: ChatResponse) -> Any:
    """The answer as JSON, or a ``LogicError`` saying why it is not (cut at the token limit, or
    not JSON, refused, filtered): what goes back to the model as a critique."""
    if response.finish_reason == "refusal":
        reason = " ".join(response.content.split())[:300] or "no reason given"
        raise LogicError(f"the model refused to answer: {reason}")
    if response.finish_reason == "content_filter":
        raise LogicError("the model's answer was withheld by the server's content filter")
    if response.finish_reason == "length":
        raise LogicError(
            f"the model's answer was cut at the token limit ({response.output_tokens} tokens)"
        )
    try:
        return json.loads(response.content)
    except json.JSONDecodeError as exc:
        raise LogicError(f"the model's answer is not JSON: {exc.msg} at char {exc.pos}") from exc
