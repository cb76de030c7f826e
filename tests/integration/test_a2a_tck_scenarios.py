"""The A2A TCK's scenarios, played by the TCK's SUT (``a2a_tck_sut``) through the product's A2A
face: raw JSON-RPC over a real socket, as the TCK sends it, with the message id prefixes of its
``scenarios/core_operations.feature``. The TCK itself runs outside the suite (``test_a2a_tck``);
this is what its artifact, message and input-required checks ask for."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stratagem.protocol import A2AServer

pytestmark = pytest.mark.asyncio

VERSION = {"A2A-Version": "1.0"}


@pytest.fixture
async def sut() -> AsyncIterator[A2AServer]:
    # Imported here, not when the file is collected: the scenario agent it defines is forgotten
    # after each test (tests/conftest.py), so no other test's deployment sees a fifth agent.
    module = importlib.import_module("tests.integration.a2a_tck_sut")
    async with module.serving() as a2a:
        yield a2a


async def _rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(url, json=body, headers=VERSION)
    assert answer.status_code == 200, answer.text
    payload: dict[str, Any] = answer.json()
    assert "result" in payload, payload
    result: dict[str, Any] = payload["result"]
    return result


async def _send(url: str, prefix: str) -> dict[str, Any]:
    message = {
        "role": "ROLE_USER",
        "parts": [{"text": "TCK artifact test"}],
        "messageId": f"{prefix}-{uuid.uuid4().hex}",
    }
    return await _rpc(url, "SendMessage", {"message": message})


def _only_part(result: dict[str, Any]) -> dict[str, Any]:
    task = result["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [len(artifact["parts"]) for artifact in task["artifacts"]] == [1]
    assert task["artifacts"][0]["artifactId"]
    part: dict[str, Any] = task["artifacts"][0]["parts"][0]
    return part


async def test_text_file_url_and_data_artifacts_are_the_scenarios(sut: A2AServer) -> None:
    text = _only_part(await _send(sut.url, "tck-artifact-text"))
    assert text["text"] == "Generated text content"
    assert "data" not in text
    file = _only_part(await _send(sut.url, "tck-artifact-file"))
    assert base64.b64decode(file["raw"]) == b"tck"
    assert (file["filename"], file["mediaType"]) == ("output.txt", "text/plain")
    url = _only_part(await _send(sut.url, "tck-artifact-file-url"))
    assert url["url"] == "https://example.com/output.txt"
    assert (url["filename"], url["mediaType"]) == ("output.txt", "text/plain")
    data = _only_part(await _send(sut.url, "tck-artifact-data"))
    assert data["data"] == {"key": "value", "count": 42}


async def test_a_message_response_is_a_message_and_its_task_is_kept(sut: A2AServer) -> None:
    result = await _send(sut.url, "tck-message-response")
    assert "task" not in result
    message = result["message"]
    assert message["role"] == "ROLE_AGENT"
    assert message["parts"] == [{"text": "Direct message response"}]
    # The plan ran all the same: its task is found, completed, with the same parts.
    task = await _rpc(sut.url, "GetTask", {"id": message["taskId"]})
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == message["parts"]


async def test_an_unknown_prefix_gets_the_sdks_default_answer(sut: A2AServer) -> None:
    part = _only_part(await _send(sut.url, "something-else"))
    assert part["text"].startswith("Unhandled messageId prefix: something-else-")


async def _follow_up(url: str, task_id: str, prefix: str, text: str) -> dict[str, Any]:
    message = {
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        "messageId": f"{prefix}-{uuid.uuid4().hex}",
        "taskId": task_id,
    }
    return await _rpc(url, "SendMessage", {"message": message})


async def test_a_gate_that_asks_is_input_required_and_the_next_messages_answer_it(
    sut: A2AServer,
) -> None:
    # The TCK's 8 skipped MUST checks need a task that stops in input-required: before, the
    # scenario got the default answer and a message to a task was refused (UnsupportedOperation).
    asked = (await _send(sut.url, "tck-input-required"))["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", asked
    assert "send the input" in asked["status"]["message"]["parts"][0]["text"]
    task_id = asked["id"]
    # An answer that does not fit the gate's schema (a string) is refused naming the value.
    misfit = {
        "role": "ROLE_USER",
        "parts": [{"data": {"not": "a string"}}],
        "messageId": f"tck-complete-task-{uuid.uuid4().hex}",
        "taskId": task_id,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": misfit}}
    async with httpx.AsyncClient(timeout=30) as http:
        refused = (await http.post(sut.url, json=body, headers=VERSION)).json()
    assert refused["error"]["code"] == -32602, refused
    assert "value" in json.dumps(refused["error"]), refused
    got = await _rpc(sut.url, "GetTask", {"id": task_id})
    assert got["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    for text in ("TCK history message 1", "TCK history message 2"):
        again = (await _follow_up(sut.url, task_id, "tck-input-required", text))["task"]
        assert (again["id"], again["status"]["state"]) == (task_id, "TASK_STATE_INPUT_REQUIRED")
    done = (await _follow_up(sut.url, task_id, "tck-complete-task", "TCK complete"))["task"]
    assert (done["id"], done["status"]["state"]) == (task_id, "TASK_STATE_COMPLETED"), done
    assert done["artifacts"][0]["parts"][0]["text"] == "Hello from TCK"
    said = [m["parts"][0]["text"] for m in done["history"] if m["role"] == "ROLE_USER"]
    assert said[-3:] == ["TCK history message 1", "TCK history message 2", "TCK complete"]
    # An ended task takes no further message, as before.
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "parts": [{"text": "more"}],
                "messageId": uuid.uuid4().hex,
                "taskId": task_id,
            }
        },
    }
    async with httpx.AsyncClient(timeout=30) as http:
        refused = (await http.post(sut.url, json=body, headers=VERSION)).json()
    assert refused["error"]["code"] == -32004, refused


async def test_a_task_waiting_for_input_can_be_cancelled(sut: A2AServer) -> None:
    task_id = (await _send(sut.url, "tck-input-required"))["task"]["id"]
    cancelled = await _rpc(sut.url, "CancelTask", {"id": task_id})
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED", cancelled
    got = await _rpc(sut.url, "GetTask", {"id": task_id})
    assert got["status"]["state"] == "TASK_STATE_CANCELED"


async def _subscribed(url: str, task_id: str, listen_s: float) -> list[dict[str, Any]]:
    """The events one ``SubscribeToTask`` stream tells within ``listen_s`` (the task waits for
    input: the stream stays open)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", url, json=body, headers=VERSION) as answer,
        ):
            async for line in answer.aiter_lines():
                if line.startswith("data:"):
                    event = json.loads(line.removeprefix("data:"))
                    events.append({k: v for k, v in event.items() if k != "id"})

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), listen_s)
    return events


async def test_subscribers_of_a_task_waiting_for_input_are_told_the_same(sut: A2AServer) -> None:
    # STREAM-ORDER-003: each working update was stamped when it was sent, so two subscribers
    # were told different events (the TCK's check failed once it could run).
    task_id = (await _send(sut.url, "tck-input-required"))["task"]["id"]
    first, second = await asyncio.gather(
        _subscribed(sut.url, task_id, 3.0), _subscribed(sut.url, task_id, 3.0)
    )
    assert len(first) >= 2, first  # the task, then its plan's events
    assert first == second
