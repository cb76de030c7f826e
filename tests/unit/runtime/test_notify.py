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
from stratagem.runtime._notify import SIGNATURE_HEADER, GateOutbox, sign

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
