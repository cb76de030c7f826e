"""Every agent an A2A agent: the official A2A SDK's client and raw JSON-RPC against a served agent.

A real perception agent behind a real ``AgentServer`` (token authentication with the cluster's
signed JWTs, the default policy, an audit log) and its ``A2AServer`` on 127.0.0.1; the clients are
the ``a2a-sdk``'s and ``httpx``. What the A2A face answers must be what the gRPC pipeline decided:
the audit records and the refusals are the pipeline's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_data_message, new_text_message
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from stratagem.agents import build_agent
from stratagem.protocol import (
    A2AConfig,
    A2AServer,
    AgentServer,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    PolicyRule,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
)
from stratagem.protocol._models import ControlRequest, PlanSnapshot
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.asyncio

TEXT = "Mira is a knight. Mira is in the courtyard."
VERSION = {"A2A-Version": "1.0"}


@dataclass
class Served:
    url: str
    signer: TokenSigner
    audit: InMemoryAuditLog
    a2a: A2AServer

    def headers(self, identity: str = "operator") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.signer.issue(identity, 600)}", **VERSION}

    def records(self, action: str) -> list[Any]:
        return [r for r in self.audit.records() if r.action == action]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    signer = TokenSigner(ClusterSecret.generate())
    audit = InMemoryAuditLog()
    agent = build_agent("perception")
    # The default policy, plus a caller allowed ExtractEntities and nothing else.
    policy = Policy(
        [
            *Policy.default().rules,
            PolicyRule(
                caller="reader", target="perception", capabilities=frozenset({"ExtractEntities"})
            ),
            # Another identity that may read, follow and cancel plans: not others' tasks.
            PolicyRule(
                caller="auditor",
                target="perception",
                capabilities=frozenset({"ExtractEntities", "Plans", "Watch", "Control.cancel"}),
            ),
        ]
    )
    server = AgentServer(
        agent,
        policy=policy,
        authenticator=TokenAuthenticator(signer),
        audit=audit,
        config=ServerConfig(default_deadline_s=10.0, grace_s=1.0, max_message_bytes=64 * 1024),
    )
    await server.start()
    a2a = A2AServer(server, agent, A2AConfig(max_message_bytes=64 * 1024))
    await a2a.start()
    try:
        yield Served(a2a.url, signer, audit, a2a)
    finally:
        await a2a.aclose()
        await server.aclose()
        await agent.aclose()


async def _rpc(served: Served, method: str, params: Any, **headers: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(served.url, json=body, headers={**VERSION, **headers})


def _message(text: str = TEXT, message_id: str | None = None) -> dict[str, Any]:
    return {
        "messageId": message_id or uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }


async def test_the_card_is_made_from_describe(served: Served) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(served.url + ".well-known/agent-card.json")).json()
    assert [skill["id"] for skill in card["skills"]] == [
        "ExtractEntities",
        "FindSpatialContext",
        "UpdateWorldState",
        "ListWorlds",
        "ShowWorld",
        "ResetWorld",
    ]
    assert card["supportedInterfaces"] == [
        {"url": served.url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    ]
    scheme = card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]
    assert (scheme["scheme"], scheme["bearerFormat"]) == ("Bearer", "JWT")
    assert card["capabilities"]["streaming"] is True


async def test_the_sdk_client_sends_a_message_and_gets_the_task(served: Served) -> None:
    async with httpx.AsyncClient(headers=served.headers(), timeout=30) as http:
        client = await create_client(
            served.url, client_config=ClientConfig(streaming=False, httpx_client=http)
        )
        message = new_text_message(TEXT, role=Role.ROLE_USER)
        answers = [
            answer async for answer in client.send_message(SendMessageRequest(message=message))
        ]
        task = answers[-1].task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        result = MessageToDict(task.artifacts[0].parts[0].data)
        assert {"mira", "courtyard"} <= {entity["id"] for entity in result["entities"]}
        # The task is the plan that served the request: GetTask reads it through Plans.
        fetched = await client.get_task(GetTaskRequest(id=task.id))
        assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
        assert fetched.artifacts[0].artifact_id == task.artifacts[0].artifact_id
    accepted = served.records("call.accepted")
    assert [r.capability for r in accepted] == ["ExtractEntities", "Plans"]
    assert accepted[0].actor == "operator"
    assert accepted[0].request_id == f"a2a:{message.message_id}"
    assert accepted[0].detail == f"plan {task.id}"


async def test_a_data_part_names_a_skill_and_carries_its_request(served: Served) -> None:
    async with httpx.AsyncClient(headers=served.headers(), timeout=30) as http:
        client = await create_client(
            served.url, client_config=ClientConfig(streaming=False, httpx_client=http)
        )
        await _extract(client)
        message = new_data_message({"entity_ids": ["mira"]}, role=Role.ROLE_USER)
        message.metadata.update({"skill": "FindSpatialContext"})
        answers = [
            answer async for answer in client.send_message(SendMessageRequest(message=message))
        ]
    task = answers[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].name == "FindSpatialContext"


async def _extract(client: Any) -> None:
    message = new_text_message(TEXT, role=Role.ROLE_USER)
    async for _ in client.send_message(SendMessageRequest(message=message)):
        pass


async def test_a_repeated_message_runs_once(served: Served) -> None:
    message = _message(message_id="same-message")
    first = await _rpc(served, "SendMessage", {"message": message}, **served.headers())
    again = await _rpc(served, "SendMessage", {"message": message}, **served.headers())
    assert first.json()["result"]["task"]["id"] == again.json()["result"]["task"]["id"]
    assert (
        first.json()["result"]["task"]["artifacts"] == again.json()["result"]["task"]["artifacts"]
    )
    assert len(served.records("call.accepted")) == 1
    assert len(served.records("call.replayed")) == 1


async def test_streaming_follows_the_plan_through_watch(served: Served) -> None:
    async with httpx.AsyncClient(headers=served.headers(), timeout=30) as http:
        client = await create_client(
            served.url, client_config=ClientConfig(streaming=True, httpx_client=http)
        )
        message = new_text_message(TEXT, role=Role.ROLE_USER)
        events = [event async for event in client.send_message(SendMessageRequest(message=message))]
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds[0] == "task"
    assert kinds[-1] == "status_update"
    assert "artifact_update" in kinds
    working = [e.status_update for e in events if e.WhichOneof("payload") == "status_update"]
    assert any("step" in e.status.message.parts[0].text for e in working[:-1])
    assert working[-1].status.state == TaskState.TASK_STATE_COMPLETED
    assert {r.capability for r in served.records("call.accepted")} == {"ExtractEntities", "Watch"}


async def test_cancelling_a_finished_task_is_refused_with_its_code(served: Served) -> None:
    sent = await _rpc(served, "SendMessage", {"message": _message()}, **served.headers())
    task_id = sent.json()["result"]["task"]["id"]
    async with httpx.AsyncClient(headers=served.headers(), timeout=30) as http:
        client = await create_client(
            served.url, client_config=ClientConfig(streaming=False, httpx_client=http)
        )
        with pytest.raises(Exception, match="cancel") as caught:
            await client.cancel_task(CancelTaskRequest(id=task_id))
    assert "TaskNotCancelable" in type(caught.value).__name__ or "-32002" in str(caught.value)
    denied = [r for r in served.audit.records() if r.capability == "Control.cancel"]
    assert denied
    assert denied[-1].code == "FAILED_PRECONDITION"


# --- bad input: the JSON-RPC / A2A error codes the specification names -----------------------


async def test_unknown_method_is_method_not_found(served: Served) -> None:
    answer = await _rpc(served, "tasks/teleport", {}, **served.headers())
    assert answer.json()["error"]["code"] == -32601


async def test_malformed_json_is_a_parse_error(served: Served) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            served.url, content=b'{"jsonrpc": "2.0", "id": ', headers=served.headers()
        )
    assert answer.json()["error"]["code"] == -32700


async def test_a_request_without_jsonrpc_is_an_invalid_request(served: Served) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            served.url, json={"id": 1, "method": "SendMessage"}, headers=served.headers()
        )
    assert answer.json()["error"]["code"] == -32600


async def test_an_unknown_task_is_task_not_found(served: Served) -> None:
    for task_id in ("a2a-0000", "not a plan id!"):
        answer = await _rpc(served, "GetTask", {"id": task_id}, **served.headers())
        assert answer.json()["error"]["code"] == -32001
    answer = await _rpc(served, "CancelTask", {"id": "a2a-0000"}, **served.headers())
    assert answer.json()["error"]["code"] == -32001


async def test_a_request_breaking_the_model_is_invalid_params_and_audited(served: Served) -> None:
    message = {**_message(), "parts": [{"data": {"text": ""}}]}
    answer = await _rpc(served, "SendMessage", {"message": message}, **served.headers())
    error = answer.json()["error"]
    assert error["code"] == -32602
    refused = served.records("call.refused")
    assert refused
    assert refused[-1].code == "INVALID_ARGUMENT"
    assert refused[-1].actor == "operator"
    assert not served.records("call.accepted")


async def test_an_unknown_skill_is_invalid_params(served: Served) -> None:
    message = {**_message(), "metadata": {"skill": "LaunchRockets"}}
    answer = await _rpc(served, "SendMessage", {"message": message}, **served.headers())
    assert answer.json()["error"]["code"] == -32602


async def test_a_file_part_is_content_type_not_supported(served: Served) -> None:
    message = {**_message(), "parts": [{"url": "file:///etc/passwd", "mediaType": "text/plain"}]}
    answer = await _rpc(served, "SendMessage", {"message": message}, **served.headers())
    assert answer.json()["error"]["code"] == -32005


async def test_no_credentials_is_401_and_audited_as_a_refusal(served: Served) -> None:
    answer = await _rpc(served, "SendMessage", {"message": _message()})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    refused = served.records("call.refused")
    assert refused
    assert refused[-1].code == "UNAUTHENTICATED"
    assert not served.records("call.accepted")


async def test_a_forged_token_is_401(served: Served) -> None:
    other = TokenSigner(ClusterSecret.generate()).issue("operator", 600)
    answer = await _rpc(served, "GetTask", {"id": "a2a-0"}, Authorization=f"Bearer {other}")
    assert answer.status_code == 401


async def test_nothing_runs_outside_the_policy(served: Served) -> None:
    # 'reader' may extract entities, but not update the world, cancel, read plans or watch.
    update = {
        **_message(),
        "parts": [{"data": {"actions": [], "dry_run": True}}],
        "metadata": {"skill": "UpdateWorldState"},
    }
    answer = await _rpc(served, "SendMessage", {"message": update}, **served.headers("reader"))
    assert answer.status_code == 403
    denied = served.records("call.denied")
    assert [r.capability for r in denied] == ["UpdateWorldState"]
    answer = await _rpc(served, "CancelTask", {"id": "a2a-0"}, **served.headers("reader"))
    assert answer.status_code == 403
    # Allowed to call, denied the Watch: a stream still ends with the outcome.
    async with httpx.AsyncClient(headers=served.headers("reader"), timeout=30) as http:
        client = await create_client(
            served.url, client_config=ClientConfig(streaming=True, httpx_client=http)
        )
        message = new_text_message(TEXT, role=Role.ROLE_USER)
        events = [event async for event in client.send_message(SendMessageRequest(message=message))]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert "Watch" in [r.capability for r in served.records("call.denied")]


async def test_an_oversized_request_is_refused_before_it_is_read(served: Served) -> None:
    body = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"x": "'
        + (b"a" * (200 * 1024))
        + b'"}}'
    )
    async with httpx.AsyncClient() as http:
        answer = await http.post(served.url, content=body, headers=served.headers())
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == -32600


async def test_many_requests_at_once_are_all_answered(served: Served) -> None:
    async def one() -> int:
        answer = await _rpc(served, "SendMessage", {"message": _message()}, **served.headers())
        return int(answer.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED")

    assert sum(await asyncio.gather(*(one() for _ in range(20)))) == 20


# --- a flood of malformed or unauthenticated requests costs the log and the audit little ------

_MALFORMED = (
    b'{"jsonrpc": "2.0", "id": ',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":5}}',
    b'{"jsonrpc":"2.0","id":1}',
    b"[1,2,3]",
    b'"hi"',
    b'{"jsonrpc":"2.0","id":1,"method":"Nope","params":{}}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}',
)


async def test_a_flood_without_credentials_is_refused_counted_and_aggregated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    signer = TokenSigner(ClusterSecret.generate())
    audit = InMemoryAuditLog()
    agent = build_agent("perception", entry_points=False)
    server = AgentServer(
        agent,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(signer),
        audit=audit,
        config=ServerConfig(grace_s=1.0),
    )
    await server.start()
    a2a = A2AServer(server, agent)
    await a2a.start()
    caplog.set_level(logging.INFO)
    sent = 0
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(60):
                for body in _MALFORMED:
                    answer = await http.post(
                        a2a.url,
                        content=body,
                        headers={"content-type": "application/json", **VERSION},
                    )
                    sent += 1
                    assert answer.status_code == 401
                    assert answer.headers["www-authenticate"].startswith("Bearer")
                    assert answer.json()["error"]["code"] == -32600
    finally:
        await a2a.aclose()
        await server.aclose()
        await agent.aclose()
    assert not [r for r in caplog.records if r.exc_info or r.exc_text]
    # A record of its own for the first few refusals, the rest counted in one aggregate.
    refused = [r for r in audit.records() if r.action == "call.refused"]
    assert 1 <= len(refused) <= 10
    assert {r.code for r in refused} == {"UNAUTHENTICATED"}
    aggregates = [r for r in audit.records() if r.action == "call.refused.aggregate"]
    counted = sum(int(r.detail.split()[0]) for r in aggregates)
    assert len(refused) + counted == sent
    # What the agent logged (the test's own HTTP client logs each request it sends).
    logged = sum(len(r.getMessage()) for r in caplog.records if not r.name.startswith("httpx"))
    assert logged < 8_000, f"{logged} bytes logged for {sent} refusals"


async def test_malformed_requests_of_a_known_caller_leave_no_tracebacks(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="a2a")
    async with httpx.AsyncClient(timeout=30) as http:
        for body in _MALFORMED:
            answer = await http.post(
                served.url,
                content=body,
                headers={"content-type": "application/json", **served.headers()},
            )
            assert answer.json()["error"]["code"] in (-32700, -32600, -32601, -32602, -32001)
    assert not [r for r in caplog.records if r.exc_info or r.exc_text]


async def test_each_malformed_request_of_a_known_caller_is_audited_under_it(
    served: Served,
) -> None:
    # Issue 32 follow-up: only refusals before authentication were audited; a verified caller's
    # malformed requests (refused by the SDK before any method's handler ran, or by the route)
    # left no record at all.
    oversized = b'{"jsonrpc": "2.0", "id": 1, "params": "' + b"a" * (200 * 1024) + b'"}'
    sent = [
        (b'{"jsonrpc": "2.0", "id": ', "application/json"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":5}}',
            "application/json",
        ),
        (b'{"jsonrpc":"2.0","id":1}', "application/json"),
        (b"[1,2,3]", "application/json"),
        (b'{"jsonrpc":"2.0","id":1,"method":"Nope","params":{}}', "application/json"),
        (b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}}', "text/plain"),
        (oversized, "application/json"),
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        for body, media in sent:
            before = len(list(served.audit.records()))
            answer = await http.post(
                served.url, content=body, headers={**served.headers(), "content-type": media}
            )
            assert answer.json()["error"]["code"] in (-32700, -32600, -32601, -32602, -32005)
            new = list(served.audit.records())[before:]
            assert [(r.action, r.actor, r.code) for r in new] == [
                ("call.refused", "operator", "INVALID_ARGUMENT")
            ], (body[:60], new)
            assert "malformed A2A request" in new[0].detail, new[0].detail
    details = [r.detail for r in served.records("call.refused")]
    assert any("Invalid params: Failed to parse message field" in d for d in details), details
    assert not served.records("call.accepted")
    assert not served.records("call.refused.aggregate")  # accountable: never aggregated


# --- returnImmediately tasks: their own deadline, and a reason when they end badly -------------


@asynccontextmanager
async def _fake_served(
    backend: FakeBackend, config: A2AConfig | None = None
) -> AsyncIterator[Served]:
    """A ``FakeBackend`` behind a real server whose default deadline is short (1 s)."""
    signer = TokenSigner(ClusterSecret.generate())
    audit = InMemoryAuditLog()
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(signer),
        audit=audit,
        config=ServerConfig(default_deadline_s=1.0, grace_s=1.0),
    )
    await server.start()
    a2a = A2AServer(server, backend, config)
    await a2a.start()
    try:
        yield Served(a2a.url, signer, audit, a2a)
    finally:
        await a2a.aclose()
        await server.aclose()


async def _submit(served: Served, text: str = "slow") -> str:
    params = {"message": _message(text), "configuration": {"returnImmediately": True}}
    answer = await _rpc(served, "SendMessage", params, **served.headers())
    task = answer.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    return str(task["id"])


async def _task(served: Served, task_id: str) -> dict[str, Any]:
    answer = await _rpc(served, "GetTask", {"id": task_id}, **served.headers())
    return dict(answer.json()["result"])


def _note(task: dict[str, Any]) -> str:
    return " ".join(part["text"] for part in task["status"].get("message", {}).get("parts", []))


async def test_a_return_immediately_task_outlives_the_default_deadline() -> None:
    backend = FakeBackend()
    remaining: list[float | None] = []
    finished = asyncio.Event()

    async def slow(request: Any, ctx: Any) -> Any:
        remaining.append(ctx.remaining())
        await asyncio.sleep(1.5)  # past the server's default deadline (1 s)
        finished.set()
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = slow
    async with _fake_served(backend) as served:
        task_id = await _submit(served)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                await finished.wait()
        backend.snapshots = [PlanSnapshot(plan_id=task_id, agent="perception", status="succeeded")]
        for _ in range(100):
            task = await _task(served, task_id)
            if task.get("artifacts"):
                break
            await asyncio.sleep(0.05)
    # Its call ran under the task's deadline (an hour by default), not the server's 1 s.
    assert remaining
    assert remaining[0] is not None
    assert remaining[0] > 600
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["name"] == "ExtractEntities"


async def test_a_task_past_its_own_deadline_fails_and_says_why() -> None:
    backend = FakeBackend()

    async def hangs(request: Any, ctx: Any) -> Any:
        await asyncio.sleep(60)

    backend.behaviour["ExtractEntities"] = hangs
    async with _fake_served(backend, A2AConfig(task_deadline_s=2.0)) as served:
        task_id = await _submit(served)
        # The plan's own record says only that it was cancelled (the agent cancels a plan
        # whose caller is gone): the task says why.
        backend.snapshots = [PlanSnapshot(plan_id=task_id, agent="perception", status="cancelled")]
        for _ in range(300):  # the task's deadline is 2 s: up to 30 s to see it end
            task = await _task(served, task_id)
            if _note(task).startswith("DEADLINE"):
                break
            await asyncio.sleep(0.1)
    assert task["status"]["state"] == "TASK_STATE_CANCELED"
    assert _note(task).startswith("DEADLINE_EXCEEDED: ")


class _Cancelling(FakeBackend):
    async def control(self, request: ControlRequest, ctx: Any) -> PlanSnapshot:
        await super().control(request, ctx)
        return PlanSnapshot(plan_id=request.plan_id, agent=self.role, status="cancelled")


async def test_a_cancelled_task_says_who_cancelled_it() -> None:
    backend = _Cancelling()

    async def hangs(request: Any, ctx: Any) -> Any:
        await asyncio.sleep(60)

    backend.behaviour["ExtractEntities"] = hangs
    async with _fake_served(backend) as served:
        task_id = await _submit(served)
        answer = await _rpc(served, "CancelTask", {"id": task_id}, **served.headers())
        cancelled = answer.json()["result"]
        backend.snapshots = [PlanSnapshot(plan_id=task_id, agent="perception", status="cancelled")]
        fetched = await _task(served, task_id)
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    assert _note(cancelled) == "cancelled by operator (CancelTask)"
    assert fetched["status"]["state"] == "TASK_STATE_CANCELED"
    assert _note(fetched) == "cancelled by operator (CancelTask)"


# --- a task is its owner's: nobody else reads, cancels or follows it ---------------------------


async def test_another_identity_is_told_the_task_does_not_exist(served: Served) -> None:
    sent = await _rpc(served, "SendMessage", {"message": _message()}, **served.headers())
    task_id = sent.json()["result"]["task"]["id"]
    other = served.headers("auditor")
    for method in ("GetTask", "CancelTask", "SubscribeToTask"):
        answer = await _rpc(served, method, {"id": task_id}, **other)
        assert answer.json()["error"]["code"] == -32001, (method, answer.text)
        assert answer.json()["error"]["message"] == f"no task {task_id!r} on this agent"
    follow_up = {**_message(), "taskId": task_id}
    answer = await _rpc(served, "SendMessage", {"message": follow_up}, **other)
    assert answer.json()["error"]["code"] == -32001
    # The same answer as for a task that does not exist.
    missing = await _rpc(served, "GetTask", {"id": "a2a-" + "0" * 32}, **other)
    assert missing.json()["error"]["message"] == f"no task {'a2a-' + '0' * 32!r} on this agent"
    # The owner still reads it; the attempts are audited under the one who made them.
    mine = await _rpc(served, "GetTask", {"id": task_id}, **served.headers())
    assert mine.json()["result"]["status"]["state"] == "TASK_STATE_COMPLETED"
    probes = [r for r in served.audit.records() if r.actor == "auditor" and r.code == "NOT_FOUND"]
    assert len(probes) >= 4
