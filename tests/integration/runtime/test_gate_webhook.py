"""Gate webhooks over real sockets: a receiver that trickles its answer holds one delivery for
its time limit and never the notices behind it; a redirect is not followed (the signature
headers go nowhere else); an internal address is refused unless a setting allows its network.

The receivers are asyncio servers on 127.0.0.1, which is internal: the outboxes here allow it
through ``WebhookSender(allowed_networks)``, as ``STRATAGEM_GATE_WEBHOOK_ALLOWED_NETWORKS`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from stratagem.planning import GateKind, GateNotice
from stratagem.runtime import load_settings
from stratagem.runtime.host._notify import GateOutbox, WebhookRefusedError, WebhookSender

KEY = b"k" * 32
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]

Handler = Callable[[dict[str, str], asyncio.StreamWriter], Awaitable[None]]


class Receiver:
    """An HTTP server on 127.0.0.1 that reads each request and lets ``handler`` answer it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.got: list[dict[str, str]] = []
        self.arrived = asyncio.Event()
        self.closing = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def trickle(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Send ``data`` one byte a second (no read waits long), until told to close."""
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), 1.0)
            if self.closing.is_set():
                return

    def url(self, path: str = "/gates") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            headers: dict[str, str] = {}
            await reader.readline()
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.got.append(headers)
            self.arrived.set()
            await self.handler(headers, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


@asynccontextmanager
async def receiving(handler: Handler) -> AsyncIterator[Receiver]:
    receiver = Receiver(handler)
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    try:
        yield receiver
    finally:
        receiver.closing.set()
        server.close()
        await asyncio.gather(*receiver.tasks, return_exceptions=True)


async def answer(status: str, writer: asyncio.StreamWriter, extra: str = "") -> None:
    writer.write(f"HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\n\r\n".encode())
    await writer.drain()


def notice(event: str, at: float) -> GateNotice:
    return GateNotice(
        "p1",
        1,
        "ok",
        GateKind.GATE,
        event,
        at,
        agent="tactical",  # type: ignore[arg-type]
        prompt="Ship?",
    )


async def test_a_trickling_receiver_holds_one_delivery_for_its_limit_not_the_next_notice(
    tmp_path: Path,
) -> None:
    first, second = notice("opened", 1000.0), notice("escalated", 1500.0)

    trickled: list[str] = []

    async def handler(headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
        if headers["x-stratagem-delivery"] == first.key and not trickled:
            trickled.append(first.key)  # its first attempt only: 17 bytes, 17 s
            await receiver.trickle(writer, b"HTTP/1.1 200 OK\r\n")
            return
        await answer("204 No Content", writer)

    async with receiving(handler) as receiver:
        outbox = GateOutbox(
            role="tactical",
            path=tmp_path / "n.sqlite3",
            audit=None,
            url=receiver.url(),
            key=KEY,
            timeout_s=3.0,
            send=WebhookSender(LOOPBACK),
        )
        await outbox.start()
        try:
            started = time.monotonic()
            await outbox.notify(first)
            await asyncio.wait_for(receiver.arrived.wait(), 10)
            await outbox.notify(second)
            for _ in range(1_000):
                if second.key in await outbox.delivered():
                    break
                await asyncio.sleep(0.01)
            second_after = time.monotonic() - started
            assert await outbox.delivered() == [second.key]
            assert second_after < 3.0  # while the first still trickles
            for _ in range(2_000):
                if first.key in await outbox.delivered():
                    break
                await asyncio.sleep(0.01)
            # Its first attempt was cut at 3 s (not after the 17 bytes' 17 s), then retried.
            assert await outbox.delivered() == [second.key, first.key]
            assert sum(h["x-stratagem-delivery"] == first.key for h in receiver.got) >= 2
        finally:
            await outbox.aclose()


async def test_the_sender_bounds_the_whole_delivery() -> None:
    async def trickle(headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
        await receiver.trickle(writer, b"HTTP/1.1 200 OK\r\n")

    async with receiving(trickle) as receiver:
        started = time.monotonic()
        status = await WebhookSender(LOOPBACK)(receiver.url(), b"{}", {}, 2.0)
        took = time.monotonic() - started
    assert status == 0
    assert took < 10.0  # the limit is 2 s for the whole delivery; the answer would take 17 s


async def test_a_redirect_is_not_followed(tmp_path: Path) -> None:
    async def elsewhere_handler(headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
        await answer("200 OK", writer)

    async with receiving(elsewhere_handler) as elsewhere:

        async def redirect(headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
            await answer("302 Found", writer, f"Location: {elsewhere.url('/steal')}\r\n")

        async with receiving(redirect) as receiver:
            sender = WebhookSender(LOOPBACK)
            headers = {"X-Stratagem-Signature": "v1=00", "X-Stratagem-Delivery": "k"}
            assert await sender(receiver.url(), b"{}", headers, 5.0) == 302
            outbox = GateOutbox(
                role="tactical",
                path=tmp_path / "n.sqlite3",
                audit=None,
                url=receiver.url(),
                key=KEY,
                timeout_s=5.0,
                send=sender,
            )
            await outbox.start()
            try:
                await outbox.notify(notice("opened", 1000.0))
                for _ in range(1_000):
                    if len(receiver.got) >= 3:  # tried again after 0.5 s and 1 s
                        break
                    await asyncio.sleep(0.01)
                assert len(receiver.got) >= 3
                assert await outbox.delivered() == []  # a 302 is not a delivery
            finally:
                await outbox.aclose()
    assert elsewhere.got == []  # neither the body nor the signature went there


async def test_an_internal_address_is_refused_unless_its_network_is_allowed(
    tmp_path: Path,
) -> None:
    async def ok(headers: dict[str, str], writer: asyncio.StreamWriter) -> None:
        await answer("204 No Content", writer)

    async with receiving(ok) as receiver:
        with pytest.raises(WebhookRefusedError, match=r"127\.0\.0\.1, an internal address"):
            await WebhookSender()(receiver.url(), b"{}", {}, 5.0)
        with pytest.raises(WebhookRefusedError, match=r"169\.254\.169\.254"):
            await WebhookSender(LOOPBACK)("http://169.254.169.254/latest/", b"{}", {}, 5.0)
        outbox = GateOutbox(
            role="tactical",
            path=tmp_path / "n.sqlite3",
            audit=None,
            url=receiver.url(),
            key=KEY,
            timeout_s=5.0,  # the default sender: nothing internal allowed
        )
        await outbox.start()
        try:
            await outbox.notify(notice("opened", 1000.0))
            await asyncio.sleep(2.0)  # attempts at 0 s, 0.5 s and 1.5 s: each refused
            assert await outbox.delivered() == []
            assert await outbox.pending() == 1
        finally:
            await outbox.aclose()
        assert receiver.got == []
        # The setting that allows it, as an agent reads it.
        settings = load_settings(
            state_dir=tmp_path / "state", gate_webhook_allowed_networks="127.0.0.1/32, ::1"
        )
        allowed = WebhookSender(settings.gate_webhook_allowed_networks)
        assert await allowed(receiver.url(), b"{}", {}, 5.0) == 204
        assert len(receiver.got) == 1
