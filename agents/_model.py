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
(4xx) raises ``LogicError``; either names what the server said (its error body, bounded, the
API key never). A server that refuses the structured-output form of ``response_format`` (say
llama-cpp-python's, which takes ``json_object`` but not ``json_schema``) is asked again in the
next form down, ``json_schema`` -> ``json_object`` -> plain text with the schema in the prompt,
and the form it took is remembered for that server (per process). An answer the model declined
to give (a refusal, or one the server's content filter withheld) is an answer, not a failure of
the call: ``parse_json_answer`` turns it into the critique a planner sends back. The API key is
a secret: it is kept out of every ``repr`` and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import Span

from stratagem.agents._model_limit import ModelLimiter, ModelTurn, TurnTimeoutError, shared_limiter
from stratagem.planning import LogicError, TransientError
from stratagem.protocol import remaining_time

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

logger = logging.getLogger(__name__)

Role = Literal["system", "user", "assistant"]

SchemaForm = Literal["json_schema", "json_object", "text"]
SCHEMA_FORMS: Final[tuple[SchemaForm, ...]] = ("json_schema", "json_object", "text")
"""The forms a JSON Schema is asked in, most constrained first: OpenAI's ``json_schema``,
``json_object`` with the schema beside it (llama-cpp-python's server constrains decoding with
it), and plain text with the schema in the prompt (nothing else carries it)."""

_learned_forms: dict[str, SchemaForm] = {}
"""The form each server (by base URL) was found to take after refusing a more constrained one."""

_BODY_LIMIT: Final = 300
"""The most characters of a server's error body quoted in a failure."""


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
            API's ``message.refusal`` gave it); ``unreadable`` when the stream could not be read
            (a chunk nested too deeply; ``content`` is then empty).
        input_tokens: Tokens of the prompt, as the server counted them.
        output_tokens: Tokens of the answer.
        latency_s: Wall time of the call, from when it was sent.
        queued_s: Time it waited for its turn at the server before it was sent.
    """

    content: str
    model: str
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    queued_s: float = 0.0


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
        timeout_s: How long one call may take once sent, first byte to last (a total, not a
            limit per read).
        schema_style: How the server takes a JSON Schema: ``json_schema`` (OpenAI's
            ``{"type": "json_schema", "json_schema": {...}}``: OpenAI, vLLM, Ollama, LM Studio) or
            ``json_object`` (``{"type": "json_object", "schema": {...}}``: llama-cpp-python's
            server, which refuses the other) or ``text`` (the schema in the prompt). The form
            asked first: a server that refuses it is asked in the next one down and remembered
            (``json_schema`` -> ``json_object`` -> ``text``).
        max_concurrent: Calls the server is given at once, by every client sharing its limiter
            (``OpenAIModelClient``'s ``limiter``); more wait their turn before they are sent (their
            ``timeout_s`` starts when they are; the caller's deadline bounds the wait). A CPU
            server answers one at a time: calls it would queue would time out there instead.
    """

    url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_s: float = 60.0
    schema_style: SchemaForm = "json_schema"
    max_concurrent: int = 4

    def __repr__(self) -> str:
        key = "<set>" if self.api_key else "<none>"
        return f"ModelConfig(url={self.url!r}, model={self.model!r}, api_key={key})"


def response_format(
    request: ChatRequest, style: SchemaForm = "json_schema"
) -> dict[str, Any] | None:
    """The ``response_format`` argument for ``request``'s schema (``None`` without one, or in the
    ``text`` form), in the server's ``style`` (see ``ModelConfig.schema_style``)."""
    if request.schema is None or style == "text":
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

    Every call is streamed, under three bounds:

    * a turn at the server first (``limiter``): the call waits in the server's one queue, at most
      until the deadline of the call being served (``protocol.remaining_time()``), and is never
      sent when that passes;
    * the whole exchange, first byte to last, within ``timeout_s`` (and the caller's deadline):
      a server that drips its answer a byte at a time is cut at that total, not per read;
    * a call cut short (its time ran out, or its caller went away) closes the stream, so a
      server that stops on a closed connection (llama.cpp's, at its next token) stops generating;
      the turn is then kept until the server shows it is free again (``GET /models``, which
      llama-cpp-python's server answers only once its model is free), so nothing is sent to the
      server while it may still be busy with the abandoned call.

    The turn's figures (requests ahead, wait) and an abandoned call's (why, after how long, tokens
    received) go on the current span (the ``chat`` span ``TracedModelClient`` makes) and into the
    metrics ``stratagem.model.queue.wait``, ``stratagem.model.queue.length``,
    ``stratagem.model.abandoned`` and ``stratagem.model.abandoned.duration``.

    Args:
        config: Where the model is.
        http_client: An ``httpx2.AsyncClient`` (openai 3's HTTP library) to send with: proxies,
            custom certificates, or a test's ``httpx2.MockTransport``; the library's own when
            ``None``.
        limiter: The turns at this server; ``None``: the process's own for its URL
            (``shared_limiter(config.url, config.max_concurrent)``). A deployment passes one every
            agent on the node shares (``runtime.FileModelLimiter``).
        meter_provider: Where the metrics go (the global provider when ``None``).

    Raises:
        ModuleNotFoundError: The ``openai`` library is missing (``pip install 'stratagem[model]'``).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        http_client: Any = None,
        limiter: ModelLimiter | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        try:
            import openai
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "model planning needs the openai library: pip install 'stratagem[model]'",
                name="openai",
            ) from exc
        self._openai = openai
        self._config = config
        self.limiter: ModelLimiter = limiter or shared_limiter(
            config.url, max(1, config.max_concurrent)
        )
        # max_retries=0: retries are the engine's business (backoff, budgets, the journal).
        self._client = openai.AsyncOpenAI(
            base_url=config.url,
            api_key=config.api_key or "none",
            timeout=config.timeout_s,
            max_retries=0,
            http_client=http_client,
        )
        self._metrics = _PathMetrics(meter_provider)

    def __repr__(self) -> str:
        return f"OpenAIModelClient({self._config!r})"

    @property
    def model(self) -> str:
        return self._config.model

    @property
    def schema_form(self) -> SchemaForm:
        """The form a schema is asked in next: the configured one, or the one this server was
        found to take after refusing it."""
        return _learned_forms.get(self._config.url, self._config.schema_style)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        form = self.schema_form
        while True:
            try:
                return await self._chat(request, form)
            except _FormRefusedError as exc:
                following = SCHEMA_FORMS[SCHEMA_FORMS.index(form) + 1]
                logger.warning(
                    "model server %s refused response_format %s (%s); asking in the %s form",
                    self._config.url,
                    form,
                    exc.body,
                    following,
                )
                _learned_forms[self._config.url] = following
                form = following

    def _arguments(self, request: ChatRequest, form: SchemaForm) -> dict[str, Any]:
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        if request.schema is not None and form == "text":
            schema = json.dumps(dict(request.schema), separators=(",", ":"))
            messages.insert(
                0,
                {
                    "role": "system",
                    "content": "Answer with one JSON object, nothing else, that follows this "
                    f"JSON Schema: {schema}",
                },
            )
        arguments: dict[str, Any] = {
            "model": self._config.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        fmt = response_format(request, form)
        if fmt is not None:
            arguments["response_format"] = fmt
        return arguments

    async def _chat(self, request: ChatRequest, form: SchemaForm) -> ChatResponse:
        arguments = self._arguments(request, form)
        left = remaining_time()
        deadline = None if left is None else time.monotonic() + left
        span = trace.get_current_span()
        try:
            async with self.limiter.turn(deadline) as turn:
                self._metrics.queued(self._config.model, turn, span)
                budget = self._config.timeout_s
                if deadline is not None:
                    budget = min(budget, deadline - time.monotonic())
                if budget <= 0:
                    raise TransientError(
                        f"model server {self._config.url}: the call's deadline passed while it "
                        f"waited for its turn ({turn.waited_s:.1f} s)"
                    )
                response = await self._stream(arguments, budget, turn, span)
        except TurnTimeoutError as exc:
            self._metrics.queued(
                self._config.model, ModelTurn(ahead=exc.ahead, waited_s=exc.waited_s), span
            )
            raise TransientError(f"model server {self._config.url}: {exc}") from exc
        return response

    async def _stream(
        self, arguments: dict[str, Any], budget: float, turn: ModelTurn, span: Span
    ) -> ChatResponse:
        openai = self._openai
        started = time.perf_counter()
        answer = _Answer()
        stream: Any = None
        why = "cancelled"
        try:
            async with asyncio.timeout(budget):
                stream = await self._client.chat.completions.create(**arguments)
                async for chunk in stream:
                    if answer.take(chunk):
                        break  # longer than any answer is let be: cut, and critiqued
            why = "cut" if answer.cut else ""
        except RecursionError:
            # The client library parses each chunk's JSON itself, recursively: a chunk nested past
            # Python's limit is the server's bad answer, critiqued like any other
            # (parse_json_answer), never an internal error.
            why = "unreadable"
            answer.unreadable = True
        except TimeoutError as exc:
            why = "timeout"
            limit = (
                f"{budget:g} s (STRATAGEM_MODEL_TIMEOUT_S)"
                if budget >= self._config.timeout_s
                else f"the {budget:.1f} s its caller's deadline left"
            )
            raise TransientError(
                f"model server {self._config.url} did not answer within {limit}; the call was "
                f"abandoned after {answer.chunks} token(s) and its stream closed"
            ) from exc
        except openai.APITimeoutError as exc:  # before its base class, APIConnectionError
            why = "timeout"
            raise TransientError(
                f"model server {self._config.url} did not answer within "
                f"{self._config.timeout_s:g} s"
            ) from exc
        except openai.APIConnectionError as exc:
            why = "unreachable"
            raise TransientError(
                f"model server {self._config.url} unreachable: {type(exc).__name__}"
            ) from exc
        except openai.RateLimitError as exc:
            why = ""
            raise TransientError(
                f"model server {self._config.url} answered 429: rate limited"
            ) from exc
        except openai.APIStatusError as exc:
            why = ""
            body = _quoted_body(exc, self._config.api_key)
            fmt = arguments.get("response_format")
            if fmt is not None and _refuses_form(exc.status_code, body, fmt["type"]):
                raise _FormRefusedError(body) from exc
            what = f"model server {self._config.url} answered {exc.status_code}"
            said = f': "{body}"' if body else ""
            if exc.status_code >= 500:
                raise TransientError(f"{what}{said}") from exc
            raise LogicError(f"{what}: the request was refused{said}") from exc
        finally:
            if stream is not None:
                # Closing an unfinished stream closes the connection: the server stops.
                with contextlib.suppress(Exception):
                    await stream.close()
            if why in ("timeout", "cancelled", "cut", "unreadable"):
                # The server may still be busy with it: the turn waits until it is not.
                turn.release_after(self._settled())
                self._metrics.abandoned(
                    self._config.model, why, time.perf_counter() - started, answer.chunks, span
                )
        latency = time.perf_counter() - started
        prompt = sum(len(m["content"]) for m in arguments["messages"])
        if answer.unreadable:
            return ChatResponse(
                content="",
                model=answer.model or self._config.model,
                finish_reason=UNREADABLE,
                input_tokens=max(1, prompt // 4),
                output_tokens=answer.chunks,
                latency_s=latency,
                queued_s=turn.waited_s,
            )
        if not answer.seen_choice:
            raise LogicError(f"model server {self._config.url} answered no choice")
        return ChatResponse(
            content=answer.text(),
            model=answer.model or self._config.model,
            finish_reason=answer.finish_reason(),
            input_tokens=answer.input_tokens
            if answer.input_tokens is not None
            else max(1, prompt // 4),
            output_tokens=answer.output_tokens
            if answer.output_tokens is not None
            else answer.chunks,
            latency_s=latency,
            queued_s=turn.waited_s,
        )

    async def _settled(self) -> None:
        """Wait until the server answers ``GET /models``: llama-cpp-python's server answers it
        only once its model is free (it stops a closed stream at its next token); a server that
        answers at once is one that runs requests side by side anyway."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._config.timeout_s):
                await self._client.models.list()
        except Exception as exc:  # the turn goes back after the timeout in any case
            logger.warning(
                "model server %s: not known to be free after an abandoned call: %s",
                self._config.url,
                type(exc).__name__,
            )
        logger.info(
            "model server %s free again %.2f s after an abandoned call",
            self._config.url,
            time.perf_counter() - started,
        )


UNREADABLE: Final = "unreadable"
"""The finish reason of an answer whose stream could not be read (a chunk nested too deeply)."""


class _FormRefusedError(Exception):
    """The server refused the ``response_format`` it was sent (``body``: what it said)."""

    def __init__(self, body: str) -> None:
        super().__init__(body)
        self.body = body


def _refuses_form(status: int, body: str, form: str) -> bool:
    """Whether an error answer refuses the ``response_format`` form sent: a 400, 422 or 500
    (llama-cpp-python's server answers 500 for a request it cannot validate) whose body names
    ``response_format`` or the form."""
    if status not in (400, 422, 500):
        return False
    said = body.lower()
    return "response_format" in said or form in said


_SECRETS: Final = re.compile(r"(?i)(bearer\s+|api[_-]?key\W+|sk-)[A-Za-z0-9._~+/=-]+")


def _quoted_body(exc: Any, api_key: str) -> str:
    """What the server's error answer said: its ``error.message`` (or its body), on one line, at
    most ``_BODY_LIMIT`` characters, the API key and anything shaped like a credential taken
    out."""
    body: Any = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        body = error.get("message", error) if isinstance(error, dict) else error
    if body is None:
        with contextlib.suppress(Exception):
            body = exc.response.text
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    if api_key:
        text = text.replace(api_key, "<key>")
    text = " ".join(_SECRETS.sub(lambda m: f"{m.group(1)}<redacted>", text).split())
    return text if len(text) <= _BODY_LIMIT else text[: _BODY_LIMIT - 1] + "…"


_ANSWER_LIMIT: Final = 1 << 20
"""The most characters of an answer read from a stream (far past any planner's limit)."""


@dataclass(slots=True)
class _Answer:
    """What a streamed completion said so far."""

    parts: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    size: int = 0
    chunks: int = 0
    finish: str = ""
    model: str = ""
    seen_choice: bool = False
    cut: bool = False
    unreadable: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None

    def take(self, chunk: Any) -> bool:
        """Add one chunk; ``True`` when the answer is already longer than any may be."""
        self.model = self.model or str(getattr(chunk, "model", "") or "")
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.input_tokens = getattr(usage, "prompt_tokens", None)
            self.output_tokens = getattr(usage, "completion_tokens", None)
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            self.seen_choice = True
            delta = choice.delta
            text = getattr(delta, "content", None)
            if text:
                self.parts.append(text)
                self.size += len(text)
                self.chunks += 1
            refused = getattr(delta, "refusal", None)
            if refused:
                self.refusal.append(str(refused))
            if choice.finish_reason:
                self.finish = str(choice.finish_reason)
        if self.size > _ANSWER_LIMIT:
            self.cut = True
            return True
        return False

    def text(self) -> str:
        return "".join(self.refusal) if self.refusal else "".join(self.parts)

    def finish_reason(self) -> str:
        if self.refusal:
            return "refusal"
        if self.cut:
            return "length"
        return self.finish or "unknown"


class _PathMetrics:
    """The model path's queue and abandoned work, as metrics and attributes of the call's span."""

    def __init__(self, meter_provider: MeterProvider | None) -> None:
        meter = get_meter(__name__, meter_provider=meter_provider)
        self._wait = meter.create_histogram(
            "stratagem.model.queue.wait",
            unit="s",
            description="Time a model call waited for its turn at the server",
        )
        self._length = meter.create_histogram(
            "stratagem.model.queue.length",
            unit="{request}",
            description="Requests ahead of a model call when it joined the server's queue",
        )
        self._abandoned = meter.create_counter(
            "stratagem.model.abandoned",
            unit="{request}",
            description="Model calls abandoned before their answer ended (timeout, caller gone)",
        )
        self._abandoned_time = meter.create_histogram(
            "stratagem.model.abandoned.duration",
            unit="s",
            description="Time the server worked on a model call that was then abandoned",
        )

    def queued(self, model: str, turn: ModelTurn, span: Span) -> None:
        attributes = {"gen_ai.request.model": model}
        self._wait.record(turn.waited_s, attributes)
        self._length.record(turn.ahead, attributes)
        if span.is_recording():
            span.set_attributes(
                {
                    "stratagem.model.queue.ahead": turn.ahead,
                    "stratagem.model.queue.wait_s": round(turn.waited_s, 6),
                }
            )

    def abandoned(self, model: str, why: str, seconds: float, tokens: int, span: Span) -> None:
        attributes = {"gen_ai.request.model": model, "stratagem.model.abandoned.reason": why}
        self._abandoned.add(1, attributes)
        self._abandoned_time.record(seconds, attributes)
        if span.is_recording():
            span.set_attributes(
                {
                    "stratagem.model.abandoned": True,
                    "stratagem.model.abandoned.reason": why,
                    "stratagem.model.abandoned.after_s": round(seconds, 6),
                    "stratagem.model.abandoned.tokens": tokens,
                }
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


MAX_ANSWER_DEPTH: Final = 32
"""The deepest nesting of arrays and objects a model's JSON answer may have (no plan needs more;
a deeper one is refused before anything walks it)."""


def _nesting(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text`` (strings skipped), without
    recursion: a 10,000-deep answer is measured, not parsed."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_json_answer(response: ChatResponse) -> Any:
    """The answer as JSON, or a ``LogicError`` saying why it is not (cut at the token limit, or
    not JSON, nested deeper than ``MAX_ANSWER_DEPTH``, refused, filtered): what goes back to the
    model as a critique."""
    if response.finish_reason == "refusal":
        reason = " ".join(response.content.split())[:300] or "no reason given"
        raise LogicError(f"the model refused to answer: {reason}")
    if response.finish_reason == UNREADABLE:
        raise LogicError(
            "the model server's stream could not be read: a chunk is nested too deeply"
        )
    if response.finish_reason == "content_filter":
        raise LogicError("the model's answer was withheld by the server's content filter")
    if response.finish_reason == "length":
        raise LogicError(
            f"the model's answer was cut at the token limit ({response.output_tokens} tokens)"
        )
    depth = _nesting(response.content)
    if depth > MAX_ANSWER_DEPTH:
        raise LogicError(
            f"the model's answer is nested {depth} levels deep; a plan needs at most "
            f"{MAX_ANSWER_DEPTH}"
        )
    try:
        return json.loads(response.content)
    except json.JSONDecodeError as exc:
        raise LogicError(f"the model's answer is not JSON: {exc.msg} at char {exc.pos}") from exc
    except RecursionError as exc:  # nesting inside what the count took for a string
        raise LogicError("the model's answer is nested too deeply to read") from exc
