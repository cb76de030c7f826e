"""The two transports to an MCP server, each bounding what one message may hold in memory.

The SDK's own stdio transport keeps reading a line until its newline comes, however long; a
server that floods its stdout would grow the agent's memory without bound. ``bounded_stdio``
spawns the server and frames its messages itself, and gives up on a message past the limit:
the server is stopped and the read stream closed, so the call waiting for it fails at once.
``bounded_http_client`` caps each HTTP response body the same way (the SDK already caps each
server-sent event).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc
import httpx2
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter

from stratagem.protocol import McpServerConfig

__all__ = ["OutputTooLarge", "bounded_http_client", "bounded_stdio", "transport_for"]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 2.0


class OutputTooLarge(Exception):
    """The server sent a message past ``max_output_bytes``."""


@asynccontextmanager
async def bounded_stdio(
    config: McpServerConfig, on_flood: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn a stdio server and exchange newline-delimited JSON-RPC with it.

    Args:
        config: The server (its ``command``, ``args``, ``env``, ``cwd``, ``max_output_bytes``).
        on_flood: Told why the connection was given up when a message passed the limit.

    Raises:
        OSError: The command cannot be started.
    """
    assert config.command is not None
    limit = config.max_output_bytes
    process = await anyio.open_process(
        [config.command, *config.args],
        env={**get_default_environment(), **config.env},
        cwd=config.cwd,
        stderr=None,
    )
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async with read_in:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        buffer += chunk[start:end]
                        start = end + 1
                        if len(buffer) > limit:
                            break
                        line = bytes(buffer).strip()
                        buffer.clear()
                        if line:
                            await read_in.send(_parse(line))
                    else:
                        buffer += chunk[start:]
                    if len(buffer) > limit:
                        on_flood(f"sent a message over {limit} bytes (max_output_bytes)")
                        with suppress(ProcessLookupError):
                            process.kill()
                        return

    async def writer() -> None:
        assert process.stdin is not None
        async with write_out:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in write_out:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reader)
        tasks.start_soon(writer)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (read_out, write_in):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


async def _stop(process: anyio.abc.Process) -> None:
    """Close the server's stdin, give it a moment to exit, then kill it."""
    if process.stdin is not None:
        with suppress(Exception):
            await process.stdin.aclose()
    with anyio.move_on_after(_STOP_GRACE_S):
        await process.wait()
    if process.returncode is None:
        with suppress(ProcessLookupError):
            process.kill()
        with anyio.move_on_after(_STOP_GRACE_S):
            await process.wait()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, on_flood: Callable[[str], None]) -> None:
        self._inner = inner
        self._limit = limit
        self._on_flood = on_flood

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                reason = f"sent a response over {self._limit} bytes (max_output_bytes)"
                self._on_flood(reason)
                raise OutputTooLarge(reason)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    """Caps each response body but a server-sent event stream (whose events the SDK caps)."""

    def __init__(self, limit: int, on_flood: Callable[[str], None]) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit
        self._on_flood = on_flood

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            response.stream = _BoundedStream(response.stream, self._limit, self._on_flood)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_http_client(
    config: McpServerConfig, on_flood: Callable[[str], None]
) -> httpx2.AsyncClient:
    """An HTTP client for a Streamable HTTP server: its headers, its limits."""
    timeout = httpx2.Timeout(config.connect_timeout_s, read=max(config.call_timeout_s, 30.0))
    return httpx2.AsyncClient(
        headers=dict(config.headers),
        timeout=timeout,
        transport=_BoundedTransport(config.max_output_bytes, on_flood),
    )


@asynccontextmanager
async def transport_for(
    config: McpServerConfig, on_flood: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The streams to ``config``'s server, over stdio or Streamable HTTP."""
    if config.command is not None:
        async with bounded_stdio(config, on_flood) as streams:
            yield streams
        return
    assert config.url is not None
    async with (
        bounded_http_client(config, on_flood) as http,
        streamable_http_client(
            config.url, http_client=http, max_sse_event_size=config.max_output_bytes
        ) as streams,
    ):
        yield streams
