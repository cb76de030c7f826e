"""The two transports to an MCP server, each bounding what one message may hold in memory.

The SDK's own stdio transport keeps reading a line until its newline comes, however long; a
server that floods its stdout would grow the agent's memory without bound. ``bounded_stdio``
spawns the server and frames its messages itself, and gives up on a message past the limit:
the server is stopped and the read stream closed, so the call waiting for it fails at once.
``bounded_http_client`` caps each HTTP response body the same way (the SDK already caps each
server-sent event).

A stdio server's standard error goes on to the agent's (as the SDK's transport lets it), bounded:
at most ``STDERR_BYTES`` per ``STDERR_WINDOW_S``; the rest is read and dropped, and one note on the
agent's standard error says how much (``_StderrBudget``), so a chatty or hostile server cannot
fill the agent's log. Its last line is kept: when the server exits, ``bounded_stdio`` says so with
its status and that line, so a server that cannot start is refused with why (``exited with status
1: ModuleNotFoundError: ...``) rather than only "Connection closed".

What a stdio server gets of the agent: the minimal environment of the SDK (``PATH``, ``HOME``,
``USER``, ...) and its configured ``env`` (which may not name ``STRATAGEM_*`` or ``RAY_*``), and,
unless its ``cwd`` is configured, a fresh empty working directory of its own, removed when it stops:
not the agent's, which may be the state folder with its secrets. That keeps the secrets out of
reach of relative paths and of the environment; it is no sandbox: the server runs as the agent's
OS user and can read by absolute path whatever that user can (docs/mcp.md, "Trust boundary").
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import httpx2
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter

from stratagem.protocol import McpServerConfig

__all__ = [
    "STDERR_BYTES",
    "STDERR_WINDOW_S",
    "OutputTooLarge",
    "bounded_http_client",
    "bounded_stdio",
    "transport_for",
]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 2.0
_EXIT_WAIT_S = 1.0
_STDERR_LINE_CHARS = 300
STDERR_BYTES: Final = 64 * 1024
"""The most of a stdio server's standard error passed on to the agent's per window."""
STDERR_WINDOW_S: Final = 60.0
"""That window, seconds."""


class _StderrBudget:
    """How much of a server's standard error goes on to the agent's: ``limit`` bytes per window;
    past that the output is counted, not written, and one note says how much was dropped."""

    def __init__(
        self,
        what: str,
        *,
        limit: int = STDERR_BYTES,
        window_s: float = STDERR_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        self._started = clock()
        self._passed = 0
        self._dropped = 0

    def admit(self, chunk: bytes) -> bytes:
        """What of ``chunk`` to write (a note first when an earlier window dropped output)."""
        now = self._clock()
        note = b""
        if now - self._started >= self._window_s:
            note = self.flush()
            self._started, self._passed = now, 0
        room = max(0, self._limit - self._passed)
        kept = chunk[:room]
        self._passed += len(kept)
        self._dropped += len(chunk) - len(kept)
        return note + kept

    def flush(self) -> bytes:
        """The note of the output dropped since the last one (``b""``: none)."""
        if not self._dropped:
            return b""
        dropped, self._dropped = self._dropped, 0
        return (
            f"\n[stratagem: {self._what} wrote more than {self._limit} bytes to its standard error "
            f"in {self._window_s:.0f} s; {dropped} bytes dropped]\n"
        ).encode()


class OutputTooLarge(Exception):
    """The server sent a message past ``max_output_bytes``."""


class _LastLine:
    """The last non-empty line of a stream fed in chunks, in bounded memory."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self.line = ""

    def feed(self, chunk: bytes) -> None:
        *complete, rest = (bytes(self._partial) + chunk).split(b"\n")
        for raw in reversed(complete):
            if raw.strip():
                self.line = _line(raw)
                break
        self._partial = bytearray(rest[-4 * _STDERR_LINE_CHARS :])

    def close(self) -> None:
        if self._partial.strip():
            self.line = _line(bytes(self._partial))
        self._partial.clear()


def _line(raw: bytes) -> str:
    text = " ".join(raw.decode("utf-8", "replace").split())
    return text if len(text) <= _STDERR_LINE_CHARS else "..." + text[-_STDERR_LINE_CHARS:]


@asynccontextmanager
async def bounded_stdio(
    config: McpServerConfig,
    on_flood: Callable[[str], None],
    on_exit: Callable[[str], None] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn a stdio server and exchange newline-delimited JSON-RPC with it.

    Args:
        config: The server (its ``command``, ``args``, ``env``, ``cwd``, ``max_output_bytes``).
        on_flood: Told why the connection was given up when a message passed the limit.
        on_exit: Told how the server ended when it closed its output and exited (its status and
            the last line of its standard error), before the read stream closes.

    Raises:
        OSError: The command cannot be started.
    """
    limit = config.max_output_bytes
    process, command, own_dir = await _spawn(config)
    budget = _StderrBudget(f"MCP server {os.path.basename(command)!r} (pid {process.pid})")
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
    last_error = _LastLine()
    errors_read = anyio.Event()

    async def errors() -> None:
        assert process.stderr is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                last_error.feed(chunk)
                # On to the agent's own standard error, where the server's would have gone.
                _write_stderr(budget.admit(chunk))
        _write_stderr(budget.flush())
        last_error.close()
        errors_read.set()

    async def exited() -> None:
        """The server closed its output: say how it ended, if it did."""
        with anyio.move_on_after(_EXIT_WAIT_S):
            await process.wait()
            await errors_read.wait()
        if process.returncode is not None and on_exit is not None:
            said = f": {last_error.line}" if last_error.line else ""
            on_exit(f"the server exited with status {process.returncode}{said}")

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
            await exited()

    async def writer() -> None:
        assert process.stdin is not None
        async with write_out:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in write_out:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(errors)
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
            _write_stderr(budget.flush())
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)


async def _spawn(config: McpServerConfig) -> tuple[anyio.abc.Process, str, str | None]:
    """Start the server's command: the process, the command run, and the folder made for it
    (``_placed``; removed again when the command cannot be started)."""
    assert config.command is not None
    command, own_dir = _placed(config.command, config.cwd)
    try:
        process = await anyio.open_process(
            [command, *config.args],
            env={**get_default_environment(), **config.env},
            cwd=config.cwd if config.cwd is not None else own_dir,
            stderr=subprocess.PIPE,
        )
    except BaseException:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        raise
    return process, command, own_dir


def _placed(command: str, cwd: Path | None) -> tuple[str, str | None]:
    """The command to run (a relative path resolved from the agent's directory, as it was
    meant) and the fresh folder to run it in when no ``cwd`` is configured (``None``: one is)."""
    if os.sep in command and not os.path.isabs(command):
        command = os.path.abspath(command)
    return command, None if cwd is not None else tempfile.mkdtemp(prefix="stratagem-mcp-")


def _write_stderr(data: bytes) -> None:
    if data:
        with suppress(OSError, ValueError):
            sys.stderr.buffer.write(data)
            sys.stderr.flush()


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
    config: McpServerConfig,
    on_flood: Callable[[str], None],
    on_exit: Callable[[str], None] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The streams to ``config``'s server, over stdio or Streamable HTTP (``on_exit``: see
    ``bounded_stdio``)."""
    if config.command is not None:
        async with bounded_stdio(config, on_flood, on_exit) as streams:
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
