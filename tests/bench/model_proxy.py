"""A measuring proxy in front of a one-worker model server (llama-cpp-python's): what share of
the server's time went into answers a client received.

llama-cpp-python's server generates one request at a time (its lock; the others wait for it), and
what a client's disconnect does depends on the request: a **streamed** answer stops at the next
token, a **non-streamed** one is generated to the end anyway, and a request still waiting for the
lock when its client left is not generated at all (a non-streamed one is refused, a streamed one
stops at its first token). The proxy keeps that order itself, one request at a time, first come
first served, so it sees exactly when the server works on what:

* a request is forwarded (on a connection of its own) only once the previous one ended;
* a client that leaves while its request waits in the proxy: the request is dropped unsent;
* a client that leaves while its answer streams: the upstream connection is closed at once (the
  server notices at its next token);
* a client that leaves during a non-streamed answer: the proxy reads the answer to its end (the
  server generates it to the end anyway), so its time is counted.

Each forwarded request is a record: kind (``chat``, ``probe`` for ``GET /models``), streamed,
when it started and ended at the server, whether its answer reached the client whole
(``delivered``) or the client left first (``abandoned``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_SILENCE_S = 600.0
"""The longest the proxy waits for the next bytes of an answer."""


@dataclass
class Forwarded:
    """One request the server worked on."""

    kind: str
    stream: bool
    queued: float
    started: float = 0.0
    ended: float = 0.0
    delivered: bool = False
    abandoned: bool = False


@dataclass
class MeasuringProxy:
    """See the module docstring: ``start()`` serves on its own thread, ``stop()`` ends it."""

    upstream_port: int
    records: list[Forwarded] = field(default_factory=list)
    dropped: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> MeasuringProxy:
        self._thread = threading.Thread(target=self._run, name="model-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            with contextlib.suppress(Exception):  # stopping goes on whatever a handler does
                asyncio.run_coroutine_threadsafe(self._close(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30)

    def unfinished(self) -> list[dict[str, Any]]:
        """The requests forwarded that have not ended (what the server is still working on)."""
        with self._lock:
            return [asdict(r) for r in self.records if not r.ended]

    def figures(self) -> dict[str, Any]:
        """Model time (the server's, per kind and outcome) and the share spent on answers the
        clients received."""
        with self._lock:
            records = [Forwarded(**asdict(r)) for r in self.records if r.ended]
            dropped = self.dropped
        chat = [r for r in records if r.kind == "chat"]
        used = sum(r.ended - r.started for r in chat if r.delivered)
        abandoned = sum(r.ended - r.started for r in chat if r.abandoned)
        probes = sum(r.ended - r.started for r in records if r.kind == "probe")
        total = sum(r.ended - r.started for r in records)
        return {
            "unfinished": len(self.unfinished()),
            "model_s": round(total, 2),
            "used_s": round(used, 2),
            "abandoned_s": round(abandoned, 2),
            "probe_s": round(probes, 2),
            "used_share": round(used / total, 4) if total else None,
            "requests": {
                "delivered": sum(1 for r in chat if r.delivered),
                "abandoned": sum(1 for r in chat if r.abandoned),
                "dropped_unsent": dropped,
                "probes": sum(1 for r in records if r.kind == "probe"),
            },
        }

    # --- serving ---------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._turn = asyncio.Lock()  # asyncio's lock wakes its waiters first come first served
        server = loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _close(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = [line for line in lines[1:] if line and ":" in line]
                length = 0
                for line in headers:
                    name, value = line.split(":", 1)
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                kind = "probe" if method == "GET" and path.endswith("/models") else "chat"
                stream = False
                if kind == "chat":
                    with contextlib.suppress(ValueError, AttributeError):
                        stream = bool(json.loads(body).get("stream"))
                kept = [
                    line
                    for line in headers
                    if line.split(":", 1)[0].strip().lower() not in ("connection", "host")
                ]
                request = (
                    "\r\n".join(
                        [
                            f"{method} {path} HTTP/1.1",
                            f"host: 127.0.0.1:{self.upstream_port}",
                            "connection: close",
                            *kept,
                        ]
                    ).encode("latin-1")
                    + b"\r\n\r\n"
                    + body
                )
                record = Forwarded(kind=kind, stream=stream, queued=time.monotonic())
                if not await self._forward(record, request, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(
        self,
        record: Forwarded,
        request: bytes,
        client: asyncio.StreamReader,
        to_client: asyncio.StreamWriter,
    ) -> bool:
        """Forward one request in its turn; whether the client connection is still usable."""
        async with self._turn:
            if client.at_eof():  # left while waiting here: never sent
                with self._lock:
                    self.dropped += 1
                return False
            record.started = time.monotonic()
            with self._lock:
                self.records.append(record)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            try:
                up_writer.write(request)
                await up_writer.drain()
                while True:
                    try:
                        async with asyncio.timeout(_SILENCE_S):
                            data = await up_reader.read(65536)
                    except TimeoutError:
                        record.abandoned = not record.delivered
                        break  # a server silent this long is not working on it
                    if not data:
                        break
                    if record.abandoned:
                        continue  # a non-streamed answer, read to its end
                    if client.at_eof():
                        record.abandoned = True
                        if record.stream:
                            break  # closing upstream: the server stops at its next token
                        continue
                    try:
                        to_client.write(data)
                        await to_client.drain()
                    except ConnectionError:
                        record.abandoned = True
                        if record.stream:
                            break
                record.delivered = not record.abandoned
            finally:
                up_writer.close()
                with contextlib.suppress(Exception):
                    await up_writer.wait_closed()
                record.ended = time.monotonic()
        # The upstream answered "connection: close"; so does the client's connection now.
        return False
