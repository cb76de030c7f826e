"""The A2A TCK's scenarios, played by the TCK's SUT (``a2a_tck_sut``) through the product's A2A
face: raw JSON-RPC over a real socket, as the TCK sends it, with the message id prefixes of its
``scenarios/core_operations.feature``. The TCK itself runs outside the suite (``test_a2a_tck``);
this is what its artifact and message checks ask for."""

from __future__ import annotations

import base64
import importlib
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
