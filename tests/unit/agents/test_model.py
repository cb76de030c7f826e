"""Model clients: the scripted one, and the OpenAI-compatible one over a fake HTTP transport (the
real library, no socket: httpx2's MockTransport answers)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from stratagem.agents import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelConfig,
    OpenAIModelClient,
    ScriptedModelClient,
    parse_json_answer,
)
from stratagem.planning import LogicError, TransientError

SECRET = "sk-test-never-shown-0123456789"
SCHEMA = {"type": "object", "properties": {"steps": {"type": "array", "maxItems": 4}}}
REQUEST = ChatRequest(
    messages=(ChatMessage("system", "Plan."), ChatMessage("user", "Mira takes the key.")),
    max_tokens=64,
    schema=SCHEMA,
    schema_name="tactical_plan",
)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gemma-3-270m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _streamed(
    content: str,
    finish: str = "stop",
    *,
    usage: dict[str, int] | None = None,
    refusal: str | None = None,
) -> httpx2.Response:
    """A streamed completion as an OpenAI-compatible server sends it: one chunk a token (here a
    few characters), the finish reason, the usage when asked for, then ``[DONE]``."""
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": content[i : i + 4]}) for i in range(0, len(content), 4)]
    if refusal is not None:
        chunks.append(_chunk({"refusal": refusal}))
    chunks.append(_chunk({}, finish))
    if usage is not None:
        chunks.append({**_chunk({}), "choices": [], "usage": usage})
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body.encode("utf-8")
    )


USAGE = {"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28}


def _client(handler: Any) -> tuple[OpenAIModelClient, list[httpx2.Request]]:
    seen: list[httpx2.Request] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        answer: httpx2.Response = handler(request)
        return answer

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(record))
    config = ModelConfig(url="http://127.0.0.1:8089/v1", model="gemma-3-270m", api_key=SECRET)
    return OpenAIModelClient(config, http_client=http), seen


async def test_a_chat_sends_the_schema_and_reads_the_answer_and_its_usage() -> None:
    client, seen = _client(lambda r: _streamed('{"steps": []}', usage=USAGE))
    answer = await client.chat(REQUEST)
    assert answer.content == '{"steps": []}'
    assert (answer.model, answer.finish_reason) == ("gemma-3-270m", "stop")
    assert (answer.input_tokens, answer.output_tokens) == (21, 7)
    (request,) = seen
    assert request.url.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    body = json.loads(request.content)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64
    assert body["messages"][1] == {"role": "user", "content": "Mira takes the key."}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "tactical_plan", "schema": SCHEMA, "strict": True},
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [(503, TransientError), (500, TransientError), (429, TransientError), (400, LogicError)],
)
async def test_a_failing_server_is_a_named_failure_class(
    status: int, kind: type[Exception]
) -> None:
    client, _ = _client(lambda r: httpx2.Response(status, json={"error": {"message": "no"}}))
    with pytest.raises(kind) as caught:
        await client.chat(REQUEST)
    assert type(caught.value) is kind
    assert str(status) in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_an_unreachable_server_is_transient() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=request)

    client, _ = _client(refuse)
    with pytest.raises(TransientError, match="unreachable"):
        await client.chat(REQUEST)


async def test_a_server_that_does_not_answer_in_time_is_transient_and_says_so() -> None:
    def stall(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("timed out", request=request)

    client, _ = _client(stall)
    with pytest.raises(TransientError, match=r"did not answer within 60 s"):
        await client.chat(REQUEST)


async def test_a_refusal_is_an_answer_whose_reason_becomes_the_critique() -> None:
    client, _ = _client(lambda r: _streamed("", refusal="I can't help with\n that."))
    answer = await client.chat(REQUEST)
    assert (answer.finish_reason, answer.content) == ("refusal", "I can't help with\n that.")
    with pytest.raises(
        LogicError, match=r"^the model refused to answer: I can't help with that\.$"
    ):
        parse_json_answer(answer)


def test_the_key_never_shows() -> None:
    config = ModelConfig(url="http://x/v1", model="m", api_key=SECRET)
    client, _ = _client(lambda r: _streamed("{}"))
    for text in (repr(config), str(config), repr(client)):
        assert SECRET not in text
    assert "api_key=<set>" in repr(config)


async def test_the_scripted_model_answers_in_order_and_records_requests() -> None:
    boom = TransientError("model server down")
    scripted = ScriptedModelClient(
        ['{"a": 1}', boom, lambda req: f'{{"n": {len(req.messages)}}}'], model="script"
    )
    first = await scripted.chat(REQUEST)
    assert first.content == '{"a": 1}'
    assert first.model == "script"
    assert first.output_tokens > 0
    with pytest.raises(TransientError):
        await scripted.chat(REQUEST)
    third = await scripted.chat(REQUEST)
    assert parse_json_answer(third) == {"n": 2}
    assert scripted.remaining == 0
    assert len(scripted.requests) == 3
    with pytest.raises(LogicError, match="no answer left"):
        await scripted.chat(REQUEST)


@pytest.mark.parametrize(
    ("response", "complaint"),
    [
        (ChatResponse('{"steps": [', "m", "length", output_tokens=64), "cut at the token limit"),
        (ChatResponse("Sure! Here is", "m", "stop"), "not JSON"),
        (ChatResponse("", "m", "content_filter"), "withheld by the server's content filter"),
        (ChatResponse("", "m", "refusal"), "refused to answer: no reason given"),
    ],
)
def test_an_answer_that_is_not_json_is_a_critique(response: ChatResponse, complaint: str) -> None:
    with pytest.raises(LogicError, match=complaint):
        parse_json_answer(response)


async def test_llama_cpp_servers_get_the_schema_in_their_own_style() -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return _streamed("{}")

    config = ModelConfig(
        url="http://127.0.0.1:8089/v1", model="gemma-3-270m", schema_style="json_object"
    )
    client = OpenAIModelClient(
        config, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    )
    await client.chat(REQUEST)
    body = json.loads(seen[0].content)
    assert body["response_format"] == {"type": "json_object", "schema": SCHEMA}


def _deep_first_chunk(depth: int) -> httpx2.Response:
    """A stream whose first chunk carries a field nested ``depth`` deep: the client library's own
    JSON parse of the chunk recurses past Python's limit."""
    deep = "[" * depth + "]" * depth
    first = json.dumps(_chunk({"content": "{"}))[:-1] + f', "extra": {deep}}}'
    body = f"data: {first}\n\n" + f"data: {json.dumps(_chunk({}, 'stop'))}\n\ndata: [DONE]\n\n"
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body.encode("utf-8")
    )


async def test_a_stream_chunk_nested_too_deeply_is_a_bad_answer_not_a_crash() -> None:
    client, _ = _client(lambda r: _deep_first_chunk(10_000))
    answer = await client.chat(REQUEST)  # before: RecursionError out of the client library
    assert answer.finish_reason == "unreadable"
    with pytest.raises(LogicError) as critique:
        parse_json_answer(answer)
    assert str(critique.value) == (
        "the model server's stream could not be read: a chunk is nested too deeply"
    )
