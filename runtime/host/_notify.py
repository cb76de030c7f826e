"""Gate notices: an agent's outbox, its audit records and the signed webhook that delivers them.

``GateOutbox`` is the ``planning.GateNotifier`` an agent actor gives its engine. When a gate of
the agent's plans opens, escalates or times out, the engine hands it a ``GateNotice``; the outbox
keeps it in ``STATE_DIR/<role>.notices.sqlite3`` (one row per notice key: a notice told again
after a restart is the same row), writes one audit record for it (``gate.opened``,
``gate.escalated``, ``gate.timed_out``: the agent as actor, no arguments or values), and, with
``STRATAGEM_GATE_WEBHOOK_URL`` set, POSTs it to the webhook until a 2xx answer, retried with a
growing delay (0.5 s doubling to 5 min) up to ``STRATAGEM_GATE_WEBHOOK_ATTEMPTS`` times. The
rows survive restarts: a restarted agent delivers what its predecessor had not.

Each delivery is bounded as a whole (``STRATAGEM_GATE_WEBHOOK_TIMEOUT_S`` from the name lookup to
the status line, not per read) and runs as its own task, up to ``MAX_IN_FLIGHT`` at once: a
receiver that trickles its answer holds one delivery for that long, never the notices behind it.
``WebhookSender`` speaks just enough HTTP/1.1 for that: it follows no redirect (a 3xx is a failed
attempt, so the signature headers go nowhere but the configured URL), and it refuses a host that
resolves to an address that is not global (loopback, private, link-local such as 169.254.169.254,
shared, reserved) unless ``STRATAGEM_GATE_WEBHOOK_ALLOWED_NETWORKS`` allows it; it connects to
the address it checked, so a second lookup cannot swap it.

The body (``docs/gates.md``): ``{"type": "gate.<event>", "key": ..., "agent": ..., "plan_id":
..., "revision": ..., "gate": <GateInfo as JSON>}``; the headers ``X-Stratagem-Delivery`` (the
key: a receiver drops one it has seen), ``X-Stratagem-Event``, ``X-Stratagem-Timestamp`` (Unix
seconds) and ``X-Stratagem-Signature: v1=<hex>``, the HMAC-SHA256 of ``"<timestamp>." + body``
under the key in ``STATE_DIR/gate-webhook.key``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import sqlite3
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

from stratagem.agents import gate_info
from stratagem.planning import TIMEOUT_APPROVER, GateNotice
from stratagem.protocol import AuditLog
from stratagem.protocol._storage import StoreWorker
from stratagem.protocol._storage._sqlite import connect
from stratagem.runtime.config._errors import StratagemRuntimeError

__all__ = [
    "MAX_IN_FLIGHT",
    "SIGNATURE_HEADER",
    "GateOutbox",
    "WebhookRefusedError",
    "WebhookSender",
    "sign",
]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER: Final = "X-Stratagem-Signature"
"""The header that carries ``v1=<hex HMAC-SHA256 of "<timestamp>." + body>``."""

MAX_IN_FLIGHT: Final = 8
"""Deliveries one outbox has under way at once (each bounded by its timeout)."""

_MAX_DELAY_S: Final = 300.0
_FIRST_DELAY_S: Final = 0.5

Sender = Callable[[str, bytes, dict[str, str], float], Awaitable[int]]
"""POSTs a body with headers to a URL within a time limit; the HTTP status (0: no answer)."""


def sign(key: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value of a webhook body sent at ``timestamp`` (Unix seconds)."""
    digest = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


class GateOutbox:
    """An agent's gate notices: kept, audited once each, delivered to the webhook (if any).

    Args:
        role: The agent's role (the audit records' actor and target).
        path: The outbox's SQLite file.
        audit: Where each notice's record goes (``None``: nowhere).
        url: The webhook (``None``: notices are kept and audited, not sent).
        key: The signing key.
        attempts: Deliveries tried per notice before it is given up.
        timeout_s: How long one delivery may take, as a whole.
        send: Sends one delivery (tests may give their own); by default a ``WebhookSender``
            that refuses internal addresses.
    """

    def __init__(
        self,
        *,
        role: str,
        path: Path,
        audit: AuditLog | None,
        url: str | None,
        key: bytes,
        attempts: int = 20,
        timeout_s: float = 10.0,
        send: Sender | None = None,
    ) -> None:
        self.role = role
        self.path = path
        self.url = url
        self._audit = audit
        self._key = key
        self._attempts = attempts
        self._timeout_s = timeout_s
        self._send = send or WebhookSender()
        self._worker = StoreWorker(f"stratagem-notices-{role}")
        self._conn: sqlite3.Connection | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()

    async def start(self) -> None:
        """Open the outbox and start delivering what it holds (a predecessor's too)."""
        await self._worker.call(self._open)
        if self.url is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._deliver(), name=f"gate webhook of {self.role}"
            )

    async def notify(self, notice: GateNotice) -> None:
        """Keep ``notice`` (once per key), audit it the first time, and wake the delivery."""
        body = _body(notice, self.role)
        new = await self._worker.call(self._keep, notice.key, body, time.time())
        if new:
            await self._record(notice)
            self._wake.set()

    async def delivered(self) -> list[str]:
        """The keys delivered so far, oldest first (for tests and ``status``)."""
        return await self._worker.call(self._delivered)

    async def pending(self) -> int:
        """How many notices wait for delivery."""
        return await self._worker.call(self._pending)

    async def aclose(self) -> None:
        """Stop delivering (what is left stays for the next start) and close the outbox."""
        task, self._task = self._task, None
        tasks = [*self._in_flight, *([task] if task is not None else [])]
        for each in tasks:
            each.cancel()
        for each in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await each
        with contextlib.suppress(Exception):
            await self._worker.call(self._close)
        self._worker.stop()

    # --- delivery ------------------------------------------------------------------------------

    async def _deliver(self) -> None:
        # Each due notice is sent by a task of its own (up to MAX_IN_FLIGHT at once): a slow
        # receiver holds that delivery for at most its timeout, and the notices behind it go out
        # meanwhile. A notice under way is not picked again until its attempt is marked.
        while True:
            self._wake.clear()
            free = MAX_IN_FLIGHT - len(self._busy)
            if free > 0:
                busy = sorted(self._busy)
                for key, body, attempts in await self._worker.call(
                    self._due, time.time(), busy, free
                ):
                    self._busy.add(key)
                    task = asyncio.get_running_loop().create_task(
                        self._deliver_one(key, body, attempts), name=f"gate webhook {key}"
                    )
                    self._in_flight.add(task)
                    task.add_done_callback(self._in_flight.discard)
            soonest = await self._worker.call(self._soonest, sorted(self._busy))
            wait = None if soonest is None else max(0.0, soonest - time.time())
            if free <= 0:
                wait = None  # a finishing delivery wakes the loop
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _deliver_one(self, key: str, body: str, attempts: int) -> None:
        assert self.url is not None
        timestamp = str(int(time.time()))
        data = body.encode()
        headers = {
            "Content-Type": "application/json",
            "X-Stratagem-Delivery": key,
            "X-Stratagem-Event": json.loads(body)["type"],
            "X-Stratagem-Timestamp": timestamp,
            SIGNATURE_HEADER: sign(self._key, timestamp, data),
        }
        try:
            async with asyncio.timeout(self._timeout_s):
                status = await self._send(self.url, data, headers, self._timeout_s)
        except TimeoutError:
            logger.warning("gate webhook %s: no answer within %.3g s", key, self._timeout_s)
            status = 0
        except WebhookRefusedError as exc:
            logger.error("gate webhook %s: %s", key, exc)
            status = 0
        except Exception as exc:  # the sender's own failure: counted as no answer
            logger.warning("gate webhook %s: %s", key, exc)
            status = 0
        try:
            await self._worker.call(self._mark, key, 200 <= status < 300, attempts + 1)
        finally:
            self._busy.discard(key)
            self._wake.set()

    async def _record(self, notice: GateNotice) -> None:
        audit = self._audit
        if audit is None:
            return
        what = f"plan {notice.plan_id} gate {notice.gate_id} ({notice.kind.value}) {notice.event}"
        if notice.event == "timed_out":
            what += f": {notice.decision or 'escalated'}"
        if notice.deciders:
            what += f"; deciders {', '.join(notice.deciders)}"
        if notice.deadline:
            what += (
                f"; deadline {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(notice.deadline))}"
            )
        if notice.tool:
            what += f"; tool {notice.tool}"
        fields: dict[str, Any] = {
            "actor": TIMEOUT_APPROVER if notice.event == "timed_out" else self.role,
            "action": f"gate.{notice.event}",
            "target": self.role,
            "capability": "Gate",
            "request_id": notice.key[:400],
            "code": "",
            "detail": what,
        }
        try:
            append_async = getattr(audit, "append_async", None)
            if append_async is not None:
                await append_async(**fields)
            else:
                await asyncio.to_thread(audit.append, **fields)
        except Exception:
            logger.exception("cannot audit gate notice %s", notice.key)

    # --- on the outbox's thread ------------------------------------------------------------------

    def _open(self) -> None:
        if self._conn is not None:
            return
        conn = connect(self.path, timeout_s=5.0, private=True)
        conn.execute(
            """CREATE TABLE IF NOT EXISTS notices (
                key TEXT PRIMARY KEY,
                body TEXT NOT NULL,
                created REAL NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_at REAL NOT NULL,
                delivered REAL,
                given_up INTEGER NOT NULL DEFAULT 0
            ) WITHOUT ROWID"""
        )
        self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._open()
        assert self._conn is not None
        return self._conn

    def _keep(self, key: str, body: str, now: float) -> bool:
        cursor = self._db().execute(
            "INSERT OR IGNORE INTO notices (key, body, created, next_at) VALUES (?, ?, ?, ?)",
            (key, body, now, now),
        )
        return cursor.rowcount == 1

    def _due(self, now: float, busy: Sequence[str], limit: int) -> list[tuple[str, str, int]]:
        marks = ",".join("?" * len(busy))
        rows = self._db().execute(
            "SELECT key, body, attempts FROM notices WHERE delivered IS NULL AND given_up = 0 "
            f"AND next_at <= ? AND key NOT IN ({marks}) ORDER BY created, key LIMIT ?",
            (now, *busy, limit),
        )
        return [(str(k), str(b), int(a)) for k, b, a in rows.fetchall()]

    def _mark(self, key: str, ok: bool, attempts: int) -> None:
        db = self._db()
        if ok:
            db.execute(
                "UPDATE notices SET delivered = ?, attempts = ? WHERE key = ?",
                (time.time(), attempts, key),
            )
            return
        if attempts >= self._attempts:
            db.execute(
                "UPDATE notices SET given_up = 1, attempts = ? WHERE key = ?", (attempts, key)
            )
            logger.error("gate webhook: gave up on %s after %d attempts", key, attempts)
            return
        delay = min(_MAX_DELAY_S, _FIRST_DELAY_S * 2 ** (attempts - 1))
        db.execute(
            "UPDATE notices SET attempts = ?, next_at = ? WHERE key = ?",
            (attempts, time.time() + delay, key),
        )

    def _soonest(self, busy: Sequence[str]) -> float | None:
        marks = ",".join("?" * len(busy))
        row = (
            self._db()
            .execute(
                "SELECT min(next_at) FROM notices WHERE delivered IS NULL AND given_up = 0 "
                f"AND key NOT IN ({marks})",
                tuple(busy),
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else float(row[0])

    def _delivered(self) -> list[str]:
        rows = self._db().execute(
            "SELECT key FROM notices WHERE delivered IS NOT NULL ORDER BY delivered, key"
        )
        return [str(row[0]) for row in rows.fetchall()]

    def _pending(self) -> int:
        row = (
            self._db()
            .execute("SELECT count(*) FROM notices WHERE delivered IS NULL AND given_up = 0")
            .fetchone()
        )
        return int(row[0])

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _body(notice: GateNotice, role: str) -> str:
    return json.dumps(
        {
            "type": f"gate.{notice.event}",
            "key": notice.key,
            "agent": role,
            "plan_id": notice.plan_id,
            "revision": notice.revision,
            "gate": gate_info(notice).model_dump(mode="json"),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


class WebhookRefusedError(StratagemRuntimeError):
    """The webhook's URL or address is refused before anything is sent (an internal address not
    allowed, a URL it cannot use); the message says which and how to allow it."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookSender:
    """POSTs one delivery over HTTP/1.1 (``https://`` with the system's trust store) and returns
    the status of the answer: no redirect followed, internal addresses refused.

    Args:
        allowed_networks: Networks of addresses that are not global (loopback, private,
            link-local...) that may still be sent to; every global address is allowed.
        ssl_context: For ``https://`` (default: the system's CAs, hostname checked).
    """

    def __init__(
        self,
        allowed_networks: Sequence[Network] = (),
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.allowed_networks = tuple(allowed_networks)
        self._ssl = ssl_context

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> int:
        """POST ``body`` to ``url`` within ``timeout_s`` in all; the status (0: no answer).

        Raises:
            WebhookRefusedError: The URL cannot be used, or its host resolves to an address
                that is not allowed (nothing is sent).
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebhookRefusedError(f"the webhook URL {url!r} is not an http(s) URL with a host")
        if any(c in value for value in headers.values() for c in "\r\n"):
            raise WebhookRefusedError("a webhook header holds a line break")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(timeout_s):
                address = await self._address(host, port)
                tls = None
                if parts.scheme == "https":
                    tls = self._ssl or ssl.create_default_context()
                reader, writer = await asyncio.open_connection(
                    address, port, ssl=tls, server_hostname=host if tls else None
                )
                try:
                    target = parts.path or "/"
                    if parts.query:
                        target += "?" + parts.query
                    netloc = host if ":" not in host else f"[{host}]"
                    if parts.port is not None:
                        netloc += f":{parts.port}"
                    head = [
                        f"POST {target} HTTP/1.1",
                        f"Host: {netloc}",
                        "User-Agent: stratagem-gate-webhook",
                        f"Content-Length: {len(body)}",
                        "Connection: close",
                        *(f"{name}: {value}" for name, value in headers.items()),
                    ]
                    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                    await writer.drain()
                    return _status(await reader.readline())
                finally:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
        except WebhookRefusedError:
            raise
        except TimeoutError:
            logger.info("gate webhook %s: no answer within %.3g s", url, timeout_s)
            return 0
        except (OSError, ValueError, UnicodeError) as exc:
            logger.info("gate webhook %s: %s", url, exc)
            return 0

    async def _address(self, host: str, port: int) -> str:
        """The first address of ``host``, once every address it resolves to is allowed."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise OSError(f"{host} resolves to no address")
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if not self.allowed(address):
                raise WebhookRefusedError(
                    f"the webhook host {host} resolves to {address}, an internal address; "
                    "STRATAGEM_GATE_WEBHOOK_ALLOWED_NETWORKS must name its network to allow it"
                )
        return addresses[0]

    def allowed(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        """Whether a delivery may go to ``address``: a global one, or one of an allowed network."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_global and not address.is_multicast:
            return True
        return any(address in network for network in self.allowed_networks)


def _status(line: bytes) -> int:
    """The status of an HTTP status line (0: not one)."""
    parts = line.split(None, 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return 0
