"""An agent's A2A face: its card and JSON-RPC (with SSE streams) over HTTP, beside its gRPC server.

The A2A SDK's Starlette routes serve the card at ``/.well-known/agent-card.json`` and JSON-RPC at
``/`` (A2A 1.0 method names; the 0.3 names too, through the SDK's compatibility adapter) under
uvicorn, on the agent's own event loop. Before the SDK parses a request, the route here bounds its
body (``max_message_bytes``: a larger one is refused with JSON-RPC ``-32600`` and HTTP 413 without
being read further) and notes the peer; every method then runs through the agent's gRPC pipeline
(``_handler.py``). A body that is not ``application/json`` is refused with ``-32005`` (HTTP 415).
A refusal for want of credentials or rights is answered with its JSON-RPC error
and HTTP 401 (``WWW-Authenticate: Bearer``) or 403.

Authentication comes first, before the body is read or parsed: a request whose credentials do not
verify is refused by the pipeline's first stage (``Describe`` stands for it, as on the MCP face),
so the refusal is audited and counted as a gRPC one is (``protocol._refusals``: a few records per
peer and window, then one aggregate), and it is answered ``-32600`` with HTTP 401 whatever its body
(malformed JSON included). A malformed request of a caller whose credentials verify (a body that
is not JSON-RPC, an unknown method, parameters that do not parse, too large, not JSON) is refused
through the pipeline too, after authentication and authorization (``Describe`` standing for it):
one ``call.refused`` ``INVALID_ARGUMENT`` record each under the verified caller, never aggregated
(the caller is accountable). The SDK's dispatcher logs each malformed request it answers with a
traceback; ``_ClientErrors`` drops those records (the error is the caller's, and answered to it):
a flood of bad requests costs the log nothing, while the SDK's own failures are still logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Final

import uvicorn
from a2a.server.context import ServerCallContext
from a2a.server.routes import create_agent_card_routes
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types import AgentCard as A2ACard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stratagem.protocol._a2a._card import a2a_card
from stratagem.protocol._a2a._handler import HTTP_STATUS_KEY, StratagemRequestHandler, call_of
from stratagem.protocol._a2a._tasks import TaskBook
from stratagem.protocol._errors import InvalidArgumentError, ProtocolUsageError, RemoteError
from stratagem.protocol._models import NoQuery
from stratagem.protocol._server import AgentServer
from stratagem.protocol._service import DESCRIBE, AgentBackend

__all__ = ["A2AConfig", "A2AServer"]

logger = logging.getLogger(__name__)

_INVALID_REQUEST: Final = -32600
_CONTENT_TYPE_NOT_SUPPORTED: Final = -32005
# The card changes only when the agent restarts with other capabilities.
_CARD_CACHING: Final = "public, max-age=300"
_SDK_DISPATCHER: Final = "a2a.server.routes.jsonrpc_dispatcher"
_MAX_TASK_DEADLINE_S: Final = 7 * 86400.0
_PARSED: Final = "stratagem.a2a.parsed"
"""Set in a request's scope once the SDK parsed it into a method's request (its handler then
runs the request through the pipeline: audited there)."""


class _ClientErrors(logging.Filter):
    """Drops the SDK dispatcher's records of requests it refused as malformed (its WARNING
    ``Request Error`` line and the tracebacks of requests that fail to parse): the caller's error,
    answered to it, is no event of the agent's. Its ERROR records of internal errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return False
        message = str(record.msg)
        return not message.startswith(("Failed to validate", "Failed to parse"))


def _quiet_sdk_dispatcher() -> None:
    sdk = logging.getLogger(_SDK_DISPATCHER)
    if not any(isinstance(f, _ClientErrors) for f in sdk.filters):
        sdk.addFilter(_ClientErrors())


@dataclass(frozen=True, slots=True)
class A2AConfig:
    """Where an agent's A2A face listens and what it accepts.

    Attributes:
        host: The address to bind (loopback by default).
        port: The port; 0 picks a free one (``A2AServer.start`` returns it).
        max_message_bytes: The largest JSON-RPC request body accepted.
        public_url: The base URL the card names, when clients reach the agent through another
            address (a proxy); ``None``: ``http://HOST:PORT/``.
        tasks_kept: How many answered tasks are kept for ``GetTask``'s artifacts.
        task_deadline_s: How long a ``returnImmediately`` task may run: its ``Call``'s deadline
            (the server's default deadline is for callers that wait for the answer; nobody waits
            for such a task, so it gets its own). Past it the task ends ``failed``, and its
            status message says so.
    """

    host: str = "127.0.0.1"
    port: int = 0
    max_message_bytes: int = 1 << 20
    public_url: str | None = None
    tasks_kept: int = 1024
    task_deadline_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ProtocolUsageError(f"A2AConfig.port must be in 0..65535, not {self.port}")
        if self.max_message_bytes <= 0 or self.tasks_kept < 1:
            raise ProtocolUsageError("A2AConfig.max_message_bytes and tasks_kept must be positive")
        if not 0 < self.task_deadline_s <= _MAX_TASK_DEADLINE_S:
            raise ProtocolUsageError(
                f"A2AConfig.task_deadline_s must be in (0, {_MAX_TASK_DEADLINE_S:.0f}], "
                f"not {self.task_deadline_s}"
            )


class _Uvicorn(uvicorn.Server):
    """uvicorn serving on a loop it does not own: the host process keeps its signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, plus the peer and the slot for the refusal's HTTP status."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        request.scope[_PARSED] = True
        context.state["peer"] = _peer(request)
        context.state[HTTP_STATUS_KEY] = request.scope.setdefault(HTTP_STATUS_KEY, {})
        return context


def _peer(request: Request) -> str:
    """The peer as gRPC names one (``ipv4:127.0.0.1:5555``)."""
    client = request.client
    if not client:
        return "unknown"
    if ":" in client.host:
        return f"ipv6:[{client.host}]:{client.port}"
    return f"ipv4:{client.host}:{client.port}"


class A2AServer:
    """One agent's A2A server: its card and JSON-RPC, served through its ``AgentServer``.

    Args:
        server: The agent's gRPC server, started (its pipeline serves every method).
        backend: The agent (its card is what ``Describe`` answers).
        config: Where to listen and what to accept.

    Use ``await a2a.start()`` and ``await a2a.aclose()``, or ``async with``.
    """

    def __init__(
        self, server: AgentServer, backend: AgentBackend, config: A2AConfig | None = None
    ) -> None:
        self._server = server
        self._backend = backend
        self._config = config or A2AConfig()
        self._uvicorn: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None
        self._port = 0
        self._card: A2ACard | None = None

    @property
    def port(self) -> int:
        """The bound port (0 before ``start``)."""
        return self._port

    @property
    def url(self) -> str:
        """The A2A base URL (``http://127.0.0.1:PORT/``).

        Raises:
            ProtocolUsageError: Before ``start``.
        """
        if self._uvicorn is None:
            raise ProtocolUsageError("the A2A server is not started")
        return self._config.public_url or self._base_url()

    @property
    def card(self) -> A2ACard:
        """The card served (after ``start``)."""
        if self._card is None:
            raise ProtocolUsageError("the A2A server is not started")
        return self._card

    async def start(self) -> int:
        """Bind and serve.

        Returns:
            The bound port.

        Raises:
            ProtocolUsageError: When already started, or the address cannot be bound.
        """
        if self._uvicorn is not None:
            raise ProtocolUsageError("the A2A server is already started")
        family = socket.AF_INET6 if ":" in self._config.host else socket.AF_INET
        # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
        # TCP, and without it every answer waits ~40 ms for the client's delayed ACK (Nagle).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._config.host, self._config.port))
        except OSError as exc:
            sock.close()
            raise ProtocolUsageError(
                f"cannot listen on {self._config.host}:{self._config.port}: {exc}"
            ) from exc
        self._port = int(sock.getsockname()[1])
        self._uvicorn = _Uvicorn(
            uvicorn.Config(
                self._app(),
                log_level="warning",
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
        )
        self._serving = asyncio.create_task(
            self._uvicorn.serve(sockets=[sock]), name=f"stratagem-a2a-{self._backend.role}"
        )
        while not self._uvicorn.started:
            if self._serving.done():
                sock.close()
                self._uvicorn = None
                await self._serving  # its error
                raise ProtocolUsageError("the A2A server stopped before it served")
            await asyncio.sleep(0.01)
        logger.info("agent %s serving A2A at %s", self._backend.role, self.url)
        return self._port

    def _app(self) -> Starlette:
        base = self._config.public_url or self._base_url()
        self._card = a2a_card(self._backend.card(), base, auth_mode=self._server.auth_mode)
        handler = StratagemRequestHandler(
            self._server,
            self._backend.role,
            self._card,
            TaskBook(self._config.tasks_kept),
            task_deadline_s=self._config.task_deadline_s,
        )
        dispatcher = JsonRpcDispatcher(handler, _ContextBuilder(), enable_v0_3_compat=True)
        limit = self._config.max_message_bytes
        _quiet_sdk_dispatcher()

        async def jsonrpc(request: Request) -> Response:
            refusal = await self._unauthenticated(request)
            if refusal is not None:
                return refusal
            response = await answer(request)
            if not request.scope.get(_PARSED):  # refused before any method's handler ran
                await self._refuse_malformed(request, response)
            return response

        async def answer(request: Request) -> Response:
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media and media != "application/json":
                return _refused(
                    _CONTENT_TYPE_NOT_SUPPORTED,
                    f"JSON-RPC requests are application/json, not {media[:80]!r}",
                    415,
                )
            body = bytearray()
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                return _too_large(limit)
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    return _too_large(limit)
            replayed = False

            async def receive() -> dict[str, Any]:
                nonlocal replayed
                if replayed:
                    return {"type": "http.disconnect"}
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}

            response = await dispatcher.handle_requests(Request(request.scope, receive))
            status = request.scope.get(HTTP_STATUS_KEY, {}).get("status")
            if status is not None and response.status_code == 200:
                response.status_code = int(status)
                if status == 401:
                    response.headers["WWW-Authenticate"] = 'Bearer realm="stratagem"'
            return response

        (card_route,) = create_agent_card_routes(self._card, cache_control=_CARD_CACHING)
        card_endpoint = card_route.endpoint
        modified = formatdate(time.time(), usegmt=True)

        async def card(request: Request) -> Response:
            response: Response = await card_endpoint(request)
            response.headers["Last-Modified"] = modified  # the card is made once, at start
            return response

        return Starlette(
            routes=[
                Route(card_route.path, card, methods=["GET"]),
                Route("/", jsonrpc, methods=["POST"]),
            ]
        )

    async def _unauthenticated(self, request: Request) -> Response | None:
        """The 401 answer of a request whose credentials do not verify (``None``: they do),
        after the pipeline has refused it: audited, and counted per peer (module docstring)."""
        call = call_of({"headers": request.headers, "peer": _peer(request)})
        try:
            self._server.authenticate(call.metadata, call.context)
        except RemoteError:
            pass
        else:
            return None
        message = "no valid credentials: send 'Authorization: Bearer <token>'"
        try:
            await self._server.serve_foreign(
                DESCRIBE.name, DESCRIBE.encode_request(NoQuery()), call.metadata, call.context
            )
        except RemoteError as error:
            message = error.message
        response = JSONResponse(
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": _INVALID_REQUEST,
                    "message": message,
                    "data": {"code": "UNAUTHENTICATED"},
                },
            },
            status_code=401,
        )
        response.headers["WWW-Authenticate"] = 'Bearer realm="stratagem"'
        return response

    async def _refuse_malformed(self, request: Request, response: Response) -> None:
        """Audit the refusal of an authenticated caller's request that never became a method's
        request (the SDK or the route refused it as malformed): through the pipeline, as
        ``Describe``, with the answer's reason."""
        reason = _error_of(response) or f"refused with HTTP {response.status_code}"
        call = call_of({"headers": request.headers, "peer": _peer(request)})
        with contextlib.suppress(RemoteError):  # the refusal, recorded; the answer is sent
            await self._server.serve_foreign(
                DESCRIBE.name,
                DESCRIBE.encode_request(NoQuery()),
                call.metadata,
                call.context,
                refusal=InvalidArgumentError(f"malformed A2A request: {reason}"[:1000]),
            )

    def _base_url(self) -> str:
        host = self._config.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self._port}/"

    async def aclose(self) -> None:
        """Stop taking requests, let those in flight finish (a few seconds), then stop."""
        if self._uvicorn is None or self._serving is None:
            return
        self._uvicorn.should_exit = True
        try:
            await self._serving
        finally:
            self._uvicorn, self._serving = None, None
        logger.info("agent %s stopped serving A2A", self._backend.role)

    async def __aenter__(self) -> A2AServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _error_of(response: Response) -> str:
    """The JSON-RPC error's message of an answer ("" : none, or a stream)."""
    body = getattr(response, "body", b"")
    if not isinstance(body, bytes) or not body.startswith(b"{"):
        return ""
    try:
        error = json.loads(body).get("error")
    except ValueError:
        return ""
    if not isinstance(error, dict):
        return ""
    message = str(error.get("message", "") or "") or f"JSON-RPC error {error.get('code')}"
    # The SDK's own reason (a parameter that does not parse) is in its details' metadata.
    data = error.get("data")
    for detail in data if isinstance(data, list) else [data]:
        metadata = detail.get("metadata") if isinstance(detail, dict) else None
        why = metadata.get("parseError") if isinstance(metadata, dict) else None
        if isinstance(why, str) and why:
            return f"{message}: {why}"
    return message


def _too_large(limit: int) -> Response:
    return _refused(_INVALID_REQUEST, f"the request is larger than {limit} bytes", 413)


def _refused(code: int, message: str, status: int) -> Response:
    """A JSON-RPC error answered before the request is parsed (its id unknown)."""
    return JSONResponse(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}},
        status_code=status,
    )
