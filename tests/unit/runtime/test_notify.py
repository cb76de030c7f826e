"""The gate outbox: notices kept once per key, audited once, delivered with retries and a
signature, and what is left delivered by the next outbox on the same file (a restart).

The sender here stands for the HTTP POST (``tests/integration/runtime/test_gate_webhook.py``
sends to a real HTTP server); it fails as told, then answers 200.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from pathlib import Path

from stratagem.planning import GateKind, GateNotice
from stratagem.protocol import InMemoryAuditLog
from stratagem.runtime.host._notify import SIGNATURE_HEADER, GateOutbox, sign

KEY = b"k" * 32


class Receiver:
    """Answers each delivery with the next status of ``statuses`` (then 200)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.got: list[tuple[bytes, dict[str, str]]] = []
        self.arrived = asyncio.Event()

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> int:
        self.got.append((body, headers))
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.arrived.set()
        return status


def notice(event: str = "opened", at: float = 1000.0) -> GateNotice:
    return GateNotice(
        "p1",
        1,
        "ok",
        GateKind.GATE,
        event,  # type: ignore[arg-type]
        at,
        agent="tactical",
        prompt="Ship?",
        deciders=("ana",),
        deadline=2000.0,
    )


async def wait_for(receiver: Receiver, count: int) -> None:
    for _ in range(5_000):
        if sum(1 for body, _ in receiver.got) >= count and receiver.arrived.is_set():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"{len(receiver.got)} deliveries, wanted {count}")


async def test_a_notice_is_kept_audited_and_signed_once_and_retried_until_taken(
    tmp_path: Path,
) -> None:
    audit = InMemoryAuditLog()
    receiver = Receiver(500, 0)  # a server error, then no answer, then taken
    outbox = GateOutbox(
        role="tactical",
        path=tmp_path / "tactical.notices.sqlite3",
        audit=audit,
        url="http://hooks.example/gates",
        key=KEY,
        send=receiver,
    )
    await outbox.start()
    try:
        await outbox.notify(notice())
        await outbox.notify(notice())  # told again (a restart): the same row, no new record
        await wait_for(receiver, 3)
        assert await outbox.delivered() == [notice().key]
        assert await outbox.pending() == 0
    finally:
        await outbox.aclose()
    bodies = {body for body, _ in receiver.got}
    assert len(bodies) == 1  # the same body each attempt
    body, headers = receiver.got[-1]
    data = json.loads(body)
    assert (data["type"], data["plan_id"], data["key"]) == ("gate.opened", "p1", notice().key)
    assert (data["gate"]["deciders"], data["gate"]["deadline"]) == (["ana"], 2000.0)
    timestamp = headers["X-Stratagem-Timestamp"]
    expected = hmac.new(KEY, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"v1={expected}" == sign(KEY, timestamp, body)
    assert headers["X-Stratagem-Delivery"] == notice().key
    records = [r for r in audit.records() if r.action.startswith("gate.")]
    assert [(r.action, r.actor, r.target) for r in records] == [
        ("gate.opened", "tactical", "tactical")
    ]
    assert "plan p1 gate ok (gate) opened; deciders ana" in records[0].detail


async def test_what_one_outbox_could_not_deliver_the_next_one_does(tmp_path: Path) -> None:
    path = tmp_path / "tactical.notices.sqlite3"
    down = Receiver(*([503] * 50))
    first = GateOutbox(
        role="tactical", path=path, audit=None, url="http://hooks.example/", key=KEY, send=down
    )
    await first.start()
    await first.notify(notice("escalated", at=1500.0))
    for _ in range(2_000):
        if down.got:
            break
        await asyncio.sleep(0.002)
    await first.aclose()  # the agent goes down with the notice not taken
    assert down.got
    up = Receiver()
    second = GateOutbox(
        role="tactical", path=path, audit=None, url="http://hooks.example/", key=KEY, send=up
    )
    await second.start()
    try:
        await second.notify(notice("escalated", at=1500.0))  # a resumed run tells it again
        await asyncio.wait_for(up.arrived.wait(), 30)
        assert await second.delivered() == [notice("escalated", at=1500.0).key]
    finally:
        await second.aclose()
    assert len(up.got) == 1


async def test_without_a_webhook_notices_are_kept_and_audited(tmp_path: Path) -> None:
    audit = InMemoryAuditLog()
    outbox = GateOutbox(
        role="tactical", path=tmp_path / "n.sqlite3", audit=audit, url=None, key=b""
    )
    await outbox.start()
    try:
        await outbox.notify(notice("timed_out", at=3000.0))
        assert await outbox.pending() == 1
    finally:
        await outbox.aclose()
    assert [(r.action, r.actor) for r in audit.records()] == [("gate.timed_out", "(timeout)")]


class Hanging:
    """Never answers the first delivery of ``slow`` (it ignores its time limit, as a receiver
    that trickles its answer would hold a per-read timeout); answers every other one at once."""

    def __init__(self, slow: str) -> None:
        self.slow = slow
        self.hung = 0
        self.taken: dict[str, asyncio.Event] = {}

    def event(self, key: str) -> asyncio.Event:
        return self.taken.setdefault(key, asyncio.Event())

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> int:
        key = headers["X-Stratagem-Delivery"]
        if key == self.slow and not self.hung:
            self.hung += 1
            await asyncio.Event().wait()  # forever
        self.event(key).set()
        return 200


async def test_a_delivery_that_hangs_does_not_hold_the_next_notice(tmp_path: Path) -> None:
    first, second = notice("opened", at=1000.0), notice("escalated", at=1500.0)
    receiver = Hanging(first.key)
    outbox = GateOutbox(
        role="tactical",
        path=tmp_path / "n.sqlite3",
        audit=None,
        url="http://hooks.example/",
        key=KEY,
        timeout_s=300.0,
        send=receiver,
    )
    await outbox.start()
    try:
        await outbox.notify(first)
        for _ in range(2_000):
            if receiver.hung:
                break
            await asyncio.sleep(0.002)
        assert receiver.hung  # the first delivery is under way and will not answer
        await outbox.notify(second)
        # Sequential deliveries kept the second behind the first's 300 s.
        await asyncio.wait_for(receiver.event(second.key).wait(), 10)
        assert await outbox.delivered() == [second.key]
    finally:
        await outbox.aclose()


async def test_a_delivery_is_bounded_as_a_whole(tmp_path: Path) -> None:
    only = notice()
    receiver = Hanging(only.key)  # the first attempt never ends by itself; the second is taken
    outbox = GateOutbox(
        role="tactical",
        path=tmp_path / "n.sqlite3",
        audit=None,
        url="http://hooks.example/",
        key=KEY,
        timeout_s=0.5,
        send=receiver,
    )
    await outbox.start()
    try:
        await outbox.notify(only)
        await asyncio.wait_for(receiver.event(only.key).wait(), 20)
        assert receiver.hung == 1
        for _ in range(2_000):
            if await outbox.delivered():
                break
            await asyncio.sleep(0.005)
        assert await outbox.delivered() == [only.key]
    finally:
        await outbox.aclose()


def test_the_sender_allows_global_addresses_and_only_the_internal_ones_it_is_told() -> None:
    import ipaddress

    from stratagem.runtime.host._notify import WebhookSender

    strict = WebhookSender()
    lenient = WebhookSender([ipaddress.ip_network("127.0.0.0/8")])
    internal = [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ]
    for text in internal:
        assert not strict.allowed(ipaddress.ip_address(text)), text
    assert lenient.allowed(ipaddress.ip_address("127.0.0.1"))
    assert lenient.allowed(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not lenient.allowed(ipaddress.ip_address("169.254.169.254"))
    for text in ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"):
        assert strict.allowed(ipaddress.ip_address(text)), text
