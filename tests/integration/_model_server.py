"""A slow scripted model server for tests: a real HTTP server (127.0.0.1, port 0) speaking the
OpenAI-compatible Chat Completions API the way llama-cpp-python's server does, recording what it
was asked to generate and what was abandoned.

Like llama.cpp's Python server it has one worker (one request generates at a time; the others wait
for it at the server), it stops a **streamed** answer when the client closes the connection (it
notices at its next token), it generates a **non-streamed** answer to the end whatever the client
does, and it answers ``GET /v1/models`` only once the worker is free. Each token takes
``token_s``; an answer is ``answer`` (a function of the request's JSON body) cut into tokens of four
characters, or ``tokens`` tokens of filler when ``answer`` is ``None``. ``drip_s`` instead sends a
streamed answer one byte at a time, ``drip_s`` apart.

Every chat request is a ``Served`` record: when it arrived, started and ended (``time.monotonic``,
one clock for the test and the server), the ``max_tokens`` it asked for, the tokens generated, and
whether the client went away before the end (``abandoned``). ``most_in_server`` is the most chat
requests the server held at once (waiting for the worker or generating).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Served:
    """One chat request as the server saw it."""

    number: int
    arrived: float
    messages: list[dict[str, Any]]
    max_tokens: int
    stream: bool
    started: float = 0.0
    ended: float = 0.0
    generated: int = 0
    planned: int = 0
    abandoned: bool = False


@dataclass
class ScriptedModelServer:
    """See the module docstring. ``start()`` serves on a thread of its own; ``stop()`` ends it."""

    answer: Callable[[dict[str, Any]], str] | None = None
    tokens: int = 50
    token_s: float = 0.02
    drip_s: float = 0.0
    usage: dict[str, int] | None = None
    served: list[Served] = field(default_factory=list)
    probes: list[tuple[float, float]] = field(default_factory=list)
    most_in_server: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self._in_server = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedModelServer:
        self._thread = threading.Thread(target=self._run, name="scripted-model", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _close(self) -> None:
        """Every connection handler ended before the loop stops (none left to be destroyed
        pending, which would report from this thread while the test's thread runs)."""
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> list[Served]:
        """The chat requests so far, in arrival order (copies)."""
        with self._lock:
            return [Served(**vars(s)) for s in self.served]

    # --- the server ------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._worker = asyncio.Lock()
        self._server = loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path.endswith("/models"):
                    await self._models(writer)
                elif method == "POST" and path.endswith("/chat/completions"):
                    await self._chat(json.loads(body), reader, writer)
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _models(self, writer: asyncio.StreamWriter) -> None:
        asked = time.monotonic()
        async with self._worker:  # as llama-cpp-python's: once the model is free
            pass
        with self._lock:
            self.probes.append((asked, time.monotonic()))
        _send_json(writer, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        await writer.drain()

    async def _chat(
        self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with self._lock:
            served = Served(
                number=len(self.served) + 1,
                arrived=time.monotonic(),
                messages=list(body.get("messages", [])),
                max_tokens=int(body.get("max_tokens", 16)),
                stream=bool(body.get("stream")),
            )
            self.served.append(served)
            self._in_server += 1
            self.most_in_server = max(self.most_in_server, self._in_server)
        # The client closing its side feeds the reader's EOF, with nothing read meanwhile.
        gone = reader.at_eof
        try:
            async with self._worker:
                served.started = time.monotonic()
                if self.drip_s:
                    await self._drip(served, writer, gone)
                else:
                    await self._generate(body, served, writer, gone)
                served.ended = time.monotonic()
        finally:
            with self._lock:
                self._in_server -= 1

    def _tokens_for(self, body: dict[str, Any]) -> list[str]:
        if self.answer is None:
            return ["word "] * self.tokens
        text = self.answer(body)
        return [text[i : i + 4] for i in range(0, len(text), 4)]

    async def _generate(
        self,
        body: dict[str, Any],
        served: Served,
        writer: asyncio.StreamWriter,
        gone: Callable[[], bool],
    ) -> None:
        tokens = self._tokens_for(body)[: served.max_tokens]
        served.planned = len(tokens)
        finish = "length" if len(self._tokens_for(body)) > served.max_tokens else "stop"
        usage = self.usage or {
            "prompt_tokens": 10,
            "completion_tokens": len(tokens),
            "total_tokens": 10 + len(tokens),
        }
        if not served.stream:
            for _ in tokens:  # to the end, as llama-cpp-python does without a stream
                await asyncio.sleep(self.token_s)
                served.generated += 1
            served.abandoned = gone()
            message = {"role": "assistant", "content": "".join(tokens)}
            _send_json(
                writer,
                {
                    "id": f"c{served.number}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "scripted",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for token in tokens:
            await asyncio.sleep(self.token_s)
            if gone():  # noticed at the next token, as llama.cpp does
                served.abandoned = True
                return
            served.generated += 1
            _send_chunk(writer, _event(served.number, {"content": token}))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        _send_chunk(writer, _event(served.number, {}, finish))
        if body.get("stream_options", {}).get("include_usage"):
            _send_chunk(writer, {**_event(served.number, {}), "choices": [], "usage": usage})
        writer.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _drip(
        self, served: Served, writer: asyncio.StreamWriter, gone: Callable[[], bool]
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        text = "data: " + json.dumps(_event(served.number, {"content": "{}"}, "stop")) + "\n\n"
        payload = (text + "data: [DONE]\n\n").encode()
        served.planned = len(payload)
        for byte in payload:
            await asyncio.sleep(self.drip_s)
            if gone():
                served.abandoned = True
                return
            served.generated += 1
            writer.write(_chunked(bytes([byte])))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        writer.write(b"0\r\n\r\n")


def _event(number: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": f"c{number}",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _send_chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    writer.write(_chunked(f"data: {json.dumps(event)}\n\n".encode()))


def _send_json(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(data)}\r\n\r\n".encode()
        + data
    )
