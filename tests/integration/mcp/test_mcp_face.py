"""An MCP client from the ``mcp`` SDK calls an agent's MCP face: a real ``AgentServer`` with
token authentication, the default policy and an audit log, and the face over Streamable HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from stratagem.agents import build_agent
from stratagem.protocol import (
    AgentServer,
    ClusterSecret,
    FaceSettings,
    InMemoryAuditLog,
    McpFace,
    Policy,
    TokenAuthenticator,
    TokenSigner,
    face_kind,
    start_face,
)


@pytest.fixture
async def face() -> AsyncIterator[tuple[McpFace, TokenSigner, InMemoryAuditLog]]:
    agent = build_agent("perception", entry_points=False)
    signer = TokenSigner(ClusterSecret.generate())
    audit = InMemoryAuditLog()
    server = AgentServer(
        agent, policy=Policy.default(), authenticator=TokenAuthenticator(signer), audit=audit
    )
    await server.start()
    mcp_face = McpFace(server)
    await mcp_face.start()
    try:
        yield mcp_face, signer, audit
    finally:
        await mcp_face.aclose()
        await server.aclose()


def client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http))


async def test_capabilities_are_tools_and_a_call_is_served_and_audited(face: Any) -> None:
    mcp_face, signer, audit = face
    assert mcp_face.url.startswith("http://127.0.0.1:")
    async with client(mcp_face.url, signer.issue("operator", 60)) as mcp:
        listed = await mcp.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert set(tools) == {
            "ExtractEntities",
            "FindSpatialContext",
            "UpdateWorldState",
            "ListWorlds",
            "ShowWorld",
            "ResetWorld",
        }
        assert "text" in tools["ExtractEntities"].input_schema["properties"]
        result = await mcp.call_tool("ExtractEntities", {"text": "Mira waits in the courtyard."})
    assert not result.is_error
    assert result.structured_content is not None
    assert "entities" in result.structured_content
    served = [r for r in audit.records() if r.capability == "ExtractEntities"]
    assert [(r.actor, r.action, r.code) for r in served] == [
        ("operator", "call.accepted", ""),
        ("operator", "call.outcome", "OK"),
    ]
    assert served[0].request_id.startswith("mcp-")


async def test_bad_arguments_are_invalid_argument_with_the_field(face: Any) -> None:
    mcp_face, signer, audit = face
    async with client(mcp_face.url, signer.issue("operator", 60)) as mcp:
        result = await mcp.call_tool("ExtractEntities", {"text": 5})
    assert result.is_error
    assert result.content[0].text.startswith("INVALID_ARGUMENT: invalid ExtractEntities arguments")
    assert "text:" in result.content[0].text
    refused = [r for r in audit.records() if r.action == "call.refused"]
    assert [(r.actor, r.capability, r.code) for r in refused] == [
        ("operator", "ExtractEntities", "INVALID_ARGUMENT")
    ]


async def test_a_caller_the_policy_does_not_allow_is_denied_and_audited(face: Any) -> None:
    mcp_face, signer, audit = face
    async with client(mcp_face.url, signer.issue("tactical", 60)) as mcp:
        result = await mcp.call_tool("ExtractEntities", {"text": "x"})
    assert result.is_error
    assert result.content[0].text == (
        "PERMISSION_DENIED: 'tactical' may not call 'ExtractEntities' on 'perception'"
    )
    denied = [r for r in audit.records() if r.action == "call.denied"]
    assert [(r.actor, r.capability) for r in denied] == [("tactical", "ExtractEntities")]
    assert not [
        r
        for r in audit.records()
        if r.action == "call.accepted"
        and r.actor == "tactical"
        and r.capability == "ExtractEntities"
    ]


@pytest.mark.parametrize("token", ["", "not-a-token", "forged"])
async def test_without_a_valid_token_the_answer_is_401_and_the_refusal_audited(
    face: Any, token: str
) -> None:
    mcp_face, _, audit = face
    if token == "forged":
        token = TokenSigner(ClusterSecret.generate()).issue("operator", 60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient(headers=headers) as http:
        answer = await http.post(
            mcp_face.url,
            json=body,
            headers={"Accept": "application/json, text/event-stream"},
        )
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    refused = [r for r in audit.records() if r.code == "UNAUTHENTICATED"]
    assert len(refused) == 1
    assert refused[0].action == "call.refused"
    assert not [r for r in audit.records() if r.action == "call.accepted"]
    # The SDK's client sees the refusal too (and nothing was served).
    with pytest.raises(BaseException):  # noqa: B017, PT011 - the SDK wraps it in a group
        async with Client(mcp_face.url) as mcp:
            await mcp.list_tools()


async def test_two_sessions_using_the_same_json_rpc_id_do_not_collide(face: Any) -> None:
    # Every MCP client numbers its requests from the same start: two sessions of one caller
    # send tools/call with the same JSON-RPC id, and each must get its own answer.
    mcp_face, signer, audit = face
    token = signer.issue("operator", 60)
    answers = []
    for text in ("Mira waits in the courtyard.", "Oren sleeps in the tower."):
        async with client(mcp_face.url, token) as mcp:
            result = await mcp.call_tool("ExtractEntities", {"text": text})
        assert not result.is_error, result.content
        assert result.structured_content is not None
        answers.append({entity["id"] for entity in result.structured_content["entities"]})
    assert "mira" in answers[0]
    assert "oren" in answers[1]
    assert "mira" not in answers[1]
    accepted = [r for r in audit.records() if r.action == "call.accepted"]
    ids = [r.request_id for r in accepted if r.capability == "ExtractEntities"]
    assert len(ids) == 2
    assert ids[0] != ids[1]


async def test_a_retry_within_one_session_is_answered_from_the_store(face: Any) -> None:
    mcp_face, signer, audit = face
    headers = {
        "Authorization": f"Bearer {signer.issue('operator', 60)}",
        "Accept": "application/json, text/event-stream",
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ExtractEntities", "arguments": {"text": "Mira waits."}},
    }
    async with httpx2.AsyncClient(headers=headers) as http:
        first = await http.post(mcp_face.url, json=call)
        session = first.headers["mcp-session-id"]
        again = await http.post(mcp_face.url, json=call, headers={"mcp-session-id": session})
        other = await http.post(mcp_face.url, json=call)  # no session: a new one
        # The face keeps no stream for server-initiated messages.
        stream = await http.get(mcp_face.url, headers={"mcp-session-id": session})
    assert first.status_code == again.status_code == other.status_code == 200
    assert other.headers["mcp-session-id"] != session
    assert again.json()["result"] == first.json()["result"]
    assert stream.status_code == 405
    actions = [r.action for r in audit.records() if r.capability == "ExtractEntities"]
    assert actions.count("call.accepted") == 2
    assert actions.count("call.replayed") == 1


async def test_a_flood_without_credentials_costs_a_bounded_audit(face: Any) -> None:
    # A regression guard: the face refused and aggregated such floods before this change too.
    mcp_face, _, audit = face
    bodies = [b'{"jsonrpc": "2.0", "id": ', b"[1, 2]", b'{"jsonrpc":"2.0","id":1}']
    async with httpx2.AsyncClient() as http:
        for index in range(150):
            answer = await http.post(
                mcp_face.url,
                content=bodies[index % len(bodies)],
                headers={"Accept": "application/json, text/event-stream"},
            )
            assert answer.status_code == 401
    refused = [r for r in audit.records() if r.action == "call.refused"]
    assert 1 <= len(refused) <= 10
    assert {r.code for r in refused} == {"UNAUTHENTICATED"}


async def test_the_face_honours_the_deployments_message_bound() -> None:
    # FaceSettings is one shape for every face: its max_message_bytes bounds an MCP request as
    # it bounds a gRPC or an A2A one (before, the MCP face took up to the SDK's own 4 MiB).
    agent = build_agent("perception", entry_points=False)
    signer = TokenSigner(ClusterSecret.generate())
    audit = InMemoryAuditLog()
    server = AgentServer(
        agent, policy=Policy.default(), authenticator=TokenAuthenticator(signer), audit=audit
    )
    await server.start()
    face = await start_face(face_kind("mcp"), server, agent, FaceSettings(max_message_bytes=4096))
    assert face is not None
    token = signer.issue("operator", 60)
    small = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    large = {**small, "params": {"_meta": {"padding": "x" * 8192}}}
    try:
        async with httpx2.AsyncClient(
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json, text/event-stream",
            }
        ) as http:
            refused = await http.post(face.url, json=large)
            served = await http.post(face.url, json=small)
    finally:
        await face.aclose()
        await server.aclose()
    assert refused.status_code == 413
    assert served.status_code == 200
    assert served.json()["result"]["tools"]
