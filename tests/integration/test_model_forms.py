"""A model server that refuses a structured-output form is asked again in the next one it takes,
and what a server says when it fails is quoted in the failure (bounded, secrets never).

The server here is a small real HTTP server (127.0.0.1, port 0) that answers as llama-cpp-python's
does when it meets a ``response_format`` type it does not take: HTTP 500 and a pydantic error
naming ``response_format``. The project's own server, addressed by URL, is in
``tests/integration/test_model_planning.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema
import pytest

from stratagem.agents import ChatMessage, ChatRequest, ModelConfig, OpenAIModelClient
from stratagem.planning import LogicError, TransientError

SCHEMA = {
    "type": "object",
    "properties": {"goal": {"type": "string"}},
    "required": ["goal"],
}
pytestmark = pytest.mark.integration

REQUEST = ChatRequest(messages=(ChatMessage("user", "Plan it."),), schema=SCHEMA)


def _llama_refusal(form: str) -> dict[str, Any]:
    """What llama-cpp-python's server answers (HTTP 500) to a ``response_format`` it refuses."""
    detail = [
        {
            "type": "literal_error",
            "loc": ["body", "response_format", "type"],
            "msg": "Input should be 'text' or 'json_object'",
            "input": form,
        }
    ]
    return {"error": {"message": str(detail), "type": "internal_server_error"}}


class FormServer:
    """Takes the ``response_format`` types in ``takes`` (``"text"``: none sent), refuses the
    others as llama.cpp's server does, and answers ``{"goal": "g"}`` streamed; records the
    request bodies. ``failure`` instead answers every chat with that status and body."""

    def __init__(self, takes: set[str], failure: tuple[int, dict[str, Any]] | None = None) -> None:
        self.takes = takes
        self.failure = failure
        self.bodies: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.bodies.append(body)
                form = body.get("response_format", {}).get("type", "text")
                if server.failure is not None:
                    self._json(*server.failure)
                elif form not in server.takes:
                    self._json(500, _llama_refusal(form))
                else:
                    self._stream('{"goal": "g"}')

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, text: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for delta, finish in [({"role": "assistant", "content": text}, None), ({}, "stop")]:
                    chunk = {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": "m",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def forms(self) -> list[str]:
        return [b.get("response_format", {}).get("type", "text") for b in self.bodies]

    def __enter__(self) -> FormServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def json_object_only() -> Iterator[FormServer]:
    with FormServer({"json_object"}) as server:
        yield server


def _client(url: str, api_key: str = "") -> OpenAIModelClient:
    return OpenAIModelClient(ModelConfig(url=url, model="m", api_key=api_key, timeout_s=20))


async def test_a_server_that_refuses_json_schema_is_asked_with_json_object_and_remembered(
    json_object_only: FormServer,
) -> None:
    answer = await _client(json_object_only.url).chat(REQUEST)
    assert json.loads(answer.content) == {"goal": "g"}
    assert json_object_only.forms() == ["json_schema", "json_object"]
    # The schema goes with json_object (llama.cpp's server constrains decoding with it).
    assert json_object_only.bodies[1]["response_format"]["schema"] == SCHEMA
    # Remembered for the server: another client of the same URL asks in that form at once.
    again = _client(json_object_only.url)
    assert again.schema_form == "json_object"
    await again.chat(REQUEST)
    assert json_object_only.forms() == ["json_schema", "json_object", "json_object"]


async def test_a_server_that_refuses_both_forms_is_asked_in_plain_text_with_the_schema() -> None:
    with FormServer({"text"}) as server:
        answer = await _client(server.url).chat(REQUEST)
    assert json.loads(answer.content) == {"goal": "g"}
    assert server.forms() == ["json_schema", "json_object", "text"]
    prompt = server.bodies[2]["messages"][0]
    assert prompt["role"] == "system"
    assert json.dumps(SCHEMA, separators=(",", ":")) in prompt["content"]
    assert "response_format" not in server.bodies[2]


async def test_a_server_error_is_quoted_bounded_and_without_secrets() -> None:
    key = "sk-live-0123456789abcdef"
    said = f"out of memory while loading; key {key}, header Bearer tok.en.value " + "x" * 2000
    with (
        FormServer(set(), failure=(503, {"error": {"message": said}})) as server,
        pytest.raises(TransientError) as failed,
    ):
        await _client(server.url, api_key=key).chat(REQUEST)
    message = str(failed.value)
    assert f'{server.url} answered 503: "out of memory while loading; key' in message
    assert key not in message
    assert "tok.en.value" not in message
    assert len(message) < 500
    # Not a refusal of the form: asked once.
    assert server.forms() == ["json_schema"]


async def test_a_refused_request_names_what_the_server_said() -> None:
    refusal = {"error": {"message": "max_tokens must be at most 256"}}
    with (
        FormServer({"json_schema"}, failure=(400, refusal)) as server,
        pytest.raises(LogicError, match='refused: "max_tokens must be at most 256"'),
    ):
        await _client(server.url).chat(REQUEST)
    assert server.forms() == ["json_schema"]


@pytest.mark.model
@pytest.mark.timeout(1800)
async def test_the_projects_own_model_server_addressed_by_url_answers_in_the_form_it_takes(
    model_server: dict[str, str],
) -> None:
    """``make model-server``'s llama.cpp server, named by URL with the default form: it refuses
    ``json_schema`` (before: every call failed "answered 500"), takes ``json_object``."""
    client = OpenAIModelClient(
        ModelConfig(url=model_server["url"], model=model_server["model"], timeout_s=600)
    )
    request = ChatRequest(
        messages=(ChatMessage("user", "Give a goal for Mira, as JSON."),),
        schema=SCHEMA,
        max_tokens=48,
    )
    answer = await client.chat(request)
    jsonschema.validate(json.loads(answer.content), SCHEMA)
    assert client.schema_form == "json_object"
