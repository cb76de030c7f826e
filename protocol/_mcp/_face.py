"""An agent's MCP face: its capabilities as MCP tools, over Streamable HTTP on loopback.

MCP clients (an IDE, another framework's agent, the ``mcp`` SDK's ``Client``) list the agent's
capabilities as tools (``tools/list``: name, description, the request model's JSON Schema as
``inputSchema``, the response model's as ``outputSchema``) and call them (``tools/call``). Nothing
here decides who may do what: every request goes through the agent's ``AgentServer`` stages
(``AgentServer.serve_foreign``), exactly as a gRPC call does:

- every HTTP request must carry ``Authorization: Bearer <token>``, a token the gRPC side accepts
  (``protocol._identity``); without one (or with a bad one) the answer is HTTP 401 with
  ``WWW-Authenticate: Bearer``, and the refusal is audited (``call.refused``, per peer budget);
- ``tools/list`` is a ``Describe`` (authorized as the ``Describe`` pseudo-capability);
- ``tools/call`` of capability ``C`` is a ``Call`` of ``C``: the policy (``PERMISSION_DENIED``,
  audited as ``call.denied``), admission, validation (field violations), the answer store (the
  session and the JSON-RPC request id make the request id, kept per caller: a call repeated
  within one session gets the stored answer), ``call.accepted`` / ``call.outcome`` records and the
  server span. A refusal or failure is a tool result with ``isError`` and one line
  ``CODE: message``.

The face speaks stateless Streamable HTTP with JSON answers: it holds no session state, but it
names sessions so that request ids do not collide. A POST without an ``Mcp-Session-Id`` header is
answered with a fresh one (the SDK's clients send it back on every later request); the request id
of a ``tools/call`` is ``mcp-<digest of the session id>-<JSON-RPC id>``. Every client numbers its
requests from the same start, so a JSON-RPC id alone would make a second session's call collide
with the first's (refused as a reused request id, or answered with the first session's answer).
A GET (a stream for server-initiated messages) is answered 405: the face sends none. A body past
``max_message_bytes`` (the deployment's, as for every face) is answered 413 unparsed. It binds
127.0.0.1 by default and refuses browsers' cross-origin requests (DNS rebinding protection).
``auth=mtls`` deployments cannot serve it (HTTP here carries no client certificate).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from pydantic import ValidationError

from stratagem.protocol._capabilities import capability_for
from stratagem.protocol._codec import decode_response, encode_call, violations_from
from stratagem.protocol._errors import (
    InvalidArgumentError,
    ProtocolUsageError,
    RemoteError,
    UnauthenticatedError,
)
from stratagem.protocol._identity import AUTHORIZATION_KEY
from stratagem.protocol._models import NoQuery
from stratagem.protocol._rpc import CAPABILITY_KEY, REQUEST_ID_KEY, TARGET_KEY
from stratagem.protocol._server import AgentServer, HttpCall
from stratagem.protocol._service import DESCRIBE, decode_card

__all__ = ["McpFace", "McpFaceConfig"]

logger = logging.getLogger(__name__)

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_START_S: Final = 10.0
_REQUEST_ID_CHARS: Final = 120
_SESSION_HEADER: Final = "mcp-session-id"
# The MCP specification's session id: visible ASCII; a longer one than this is not ours.
_SESSION_ID: Final = re.compile(r"^[\x21-\x7e]{1,128}$")
_SESSION_KEY: Final = "stratagem.mcp_session"


@dataclass(frozen=True, slots=True)
class McpFaceConfig:
    """Where an agent's MCP face listens.

    Attributes:
        host: The address to bind (loopback by default: the face is for local MCP clients).
        port: The port; 0 picks a free one (``McpFace.start`` returns it).
        path: The endpoint's path.
        max_message_bytes: The largest request body accepted; a larger one is answered HTTP 413
            before it is parsed (the deployment's ``max_message_bytes``, as for gRPC and A2A).
    """

    host: str = "127.0.0.1"
    port: int = 0
    path: str = "/mcp"
    max_message_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ProtocolUsageError(f"McpFaceConfig.port must be in 0..65535, not {self.port}")
        if self.max_message_bytes <= 0:
            raise ProtocolUsageError("McpFaceConfig.max_message_bytes must be positive")
        if not self.path.startswith("/"):
            raise ProtocolUsageError("McpFaceConfig.path must start with '/'")


def _peer(scope: _Scope) -> str:
    client = scope.get("client")
    if not client:
        return "unknown"
    host, port = client[0], client[1]
    return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"


def _headers(scope: _Scope) -> dict[str, str]:
    return {
        key.decode("latin-1").lower(): value.decode("latin-1")
        for key, value in scope.get("headers", ())
    }


class _Quiet(uvicorn.Server):
    """uvicorn without its signal handlers: the face lives inside an agent's process (a Ray actor
    or a test), whose signals are not its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class McpFace:
    """Serves one agent's capabilities as MCP tools (see the module docstring).

    Args:
        server: The agent's gRPC server, whose stages every request goes through.
        config: Where to listen.
        description: A capability's tool description (by capability name), when one is known.

    Use ``await face.start()`` and ``await face.aclose()``.
    """

    def __init__(
        self,
        server: AgentServer,
        config: McpFaceConfig | None = None,
        *,
        description: Callable[[str], str] | None = None,
    ) -> None:
        self._server = server
        self._config = config or McpFaceConfig()
        self._describe = description or (lambda name: f"Stratagem capability {name}")
        self._role = server.role
        self._mcp = Server(
            f"stratagem-{self._role}",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._app = self._mcp.streamable_http_app(
            streamable_http_path=self._config.path,
            stateless_http=True,
            json_response=True,
            host=self._config.host,
            max_request_body_size=self._config.max_message_bytes,
        )
        self._uvicorn: _Quiet | None = None
        self._task: asyncio.Task[None] | None = None
        self._port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind and serve; the bound port.

        Raises:
            ProtocolUsageError: Already started, or the address cannot be bound.
        """
        if self._task is not None:
            raise ProtocolUsageError("the MCP face is already started")
        config = uvicorn.Config(
            self._asgi,
            host=self._config.host,
            port=self._config.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            interface="asgi3",
        )
        self._uvicorn = _Quiet(config)
        self._task = asyncio.create_task(self._serve(), name=f"mcp-face-{self._role}")
        async with asyncio.timeout(_START_S):
            while not self._uvicorn.started:
                if self._task.done():
                    break
                await asyncio.sleep(0.01)
        if not self._uvicorn.started:
            self._uvicorn.should_exit = True
            await self._task
            self._task = None
            address = f"{self._config.host}:{self._config.port}"
            raise ProtocolUsageError(f"the MCP face cannot listen on {address}")
        sockets = self._uvicorn.servers[0].sockets
        self._port = int(sockets[0].getsockname()[1])
        logger.info("agent %s: MCP face on %s", self._role, self.url)
        return self._port

    async def _serve(self) -> None:
        assert self._uvicorn is not None
        try:
            await self._uvicorn.serve()
        except SystemExit:  # uvicorn's way of saying it could not start (a port taken)
            logger.error("agent %s: the MCP face could not start", self._role)

    @property
    def url(self) -> str:
        """The endpoint's URL, e.g. ``http://127.0.0.1:8123/mcp``."""
        host = self._config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self._port}{self._config.path}"

    async def aclose(self) -> None:
        """Stop serving (requests in flight are let finish briefly)."""
        task, self._task = self._task, None
        if task is None or self._uvicorn is None:
            return
        self._uvicorn.should_exit = True
        try:
            async with asyncio.timeout(_START_S):
                await task
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- HTTP: authentication first -----------------------------------------------------------

    async def _asgi(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = _headers(scope)
        try:
            scope.setdefault("state", {})["stratagem.caller"] = self._server.authenticate(
                {AUTHORIZATION_KEY: headers.get(AUTHORIZATION_KEY, "")}, HttpCall(_peer(scope))
            )
        except UnauthenticatedError:
            # Refused by the pipeline's first stage, so the refusal is audited as a gRPC one.
            with contextlib.suppress(RemoteError):
                await self._server.serve_foreign(
                    DESCRIBE.name,
                    DESCRIBE.encode_request(NoQuery()),
                    {AUTHORIZATION_KEY: headers.get(AUTHORIZATION_KEY, "")},
                    HttpCall(_peer(scope)),
                )
            await _unauthorized(send)
            return
        if scope.get("method") == "GET":
            await _no_stream(send)
            return
        session = headers.get(_SESSION_HEADER, "")
        if _SESSION_ID.fullmatch(session):
            scope["state"][_SESSION_KEY] = session
            await self._app(scope, receive, send)
            return
        # A new session: named here, and the name handed to the client with the answer.
        session = uuid.uuid4().hex
        scope["state"][_SESSION_KEY] = session

        async def send_naming_the_session(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                named = [
                    (k, v) for k, v in message.get("headers", ()) if k.lower() != b"mcp-session-id"
                ]
                message["headers"] = [*named, (_SESSION_HEADER.encode(), session.encode())]
            await send(message)

        await self._app(scope, receive, send_naming_the_session)

    # --- MCP: tools are capabilities -----------------------------------------------------------

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        metadata, call, _ = self._metadata(ctx)
        try:
            data = await self._server.serve_foreign(
                DESCRIBE.name, DESCRIBE.encode_request(NoQuery()), metadata, call
            )
        except RemoteError as exc:
            raise _mcp_error(exc) from None
        card = decode_card(data)
        tools = [
            types.Tool(
                name=capability.name,
                description=self._describe(capability.name),
                input_schema=json.loads(capability.request_schema),
                output_schema=json.loads(capability.response_schema),
            )
            for capability in card.capabilities
        ]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        metadata, call, caller = self._metadata(ctx)
        name = params.name
        arguments = params.arguments or {}
        request_id = _request_id(ctx, _session_of(ctx))
        metadata.update(
            {TARGET_KEY: self._role, CAPABILITY_KEY: name[:64], REQUEST_ID_KEY: request_id}
        )
        spec = capability_for(self._role, name)
        refusal: RemoteError | None = None
        request = json.dumps(arguments, sort_keys=True).encode()
        if spec is None:
            refusal = InvalidArgumentError(f"the {self._role} agent has no tool {name[:64]!r}")
        else:
            try:
                body = spec.request.model_validate(arguments)
                request = encode_call(
                    spec,
                    request_id=request_id,
                    caller=caller,
                    target=self._role,
                    plan_id="",
                    step_id="",
                    body=body,
                )
            except ValidationError as exc:
                refusal = InvalidArgumentError(
                    f"invalid {name} arguments", violations=violations_from(exc)
                )
        try:
            data = await self._server.serve_foreign(
                "Call", request, metadata, call, refusal=refusal
            )
        except RemoteError as exc:
            return _tool_error(exc)
        body = decode_response(data).body
        structured = body.model_dump(mode="json")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(structured))],
            structured_content=structured,
        )

    def _metadata(self, ctx: Any) -> tuple[dict[str, str], HttpCall, str]:
        """The call's metadata (its credentials, its trace context), its transport context and
        the caller the HTTP layer authenticated."""
        request = getattr(ctx, "request", None)
        scope: _Scope = getattr(request, "scope", {}) or {}
        headers = _headers(scope)
        metadata = {AUTHORIZATION_KEY: headers.get(AUTHORIZATION_KEY, "")}
        traceparent = headers.get("traceparent")
        if traceparent:
            metadata["traceparent"] = traceparent
        caller = str(scope.get("state", {}).get("stratagem.caller", ""))
        return metadata, HttpCall(_peer(scope)), caller


def _session_of(ctx: Any) -> str:
    """The MCP session the request belongs to (named by ``McpFace._asgi``)."""
    request = getattr(ctx, "request", None)
    scope: _Scope = getattr(request, "scope", {}) or {}
    return str(scope.get("state", {}).get(_SESSION_KEY, ""))


def _request_id(ctx: Any, session: str) -> str:
    """The Call's request id: the session's and the JSON-RPC id, prefixed so it cannot collide
    with gRPC callers' ids (a fresh one when either is not usable)."""
    raw = str(getattr(ctx, "request_id", "") or "")
    usable = session and raw and all(ch.isalnum() or ch in "-_.:" for ch in raw)
    if not usable:
        return f"mcp-{uuid.uuid4().hex}"
    scope = hashlib.sha256(session.encode()).hexdigest()[:16]
    return f"mcp-{scope}-{raw[:_REQUEST_ID_CHARS]}"


def _tool_error(error: RemoteError) -> types.CallToolResult:
    message = f"{error.code.value}: {error.message}"
    if error.violations:
        message += " (" + "; ".join(f"{v.field}: {v.description}" for v in error.violations) + ")"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


def _mcp_error(error: RemoteError) -> Exception:
    from mcp import MCPError

    return MCPError(code=types.INVALID_REQUEST, message=f"{error.code.value}: {error.message}")


async def _no_stream(send: _Send) -> None:
    """A GET's answer: the face sends no server-initiated messages, so it opens no stream."""
    await send(
        {
            "type": "http.response.start",
            "status": 405,
            "headers": [(b"allow", b"POST"), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _unauthorized(send: _Send) -> None:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32001, "message": "UNAUTHENTICATED: send a bearer token"},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer realm="stratagem"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
