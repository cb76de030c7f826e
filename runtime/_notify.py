"""Gate notices: an agent's outbox, its audit records and the signed webhook that delivers them.

``GateOutbox`` is the ``planning.GateNotifier`` an agent actor gives its engine. When a gate of
the agent's plans opens, escalates or times out, the engine hands it a ``GateNotice``; the outbox
keeps it in ``STATE_DIR/<role>.notices.sqlite3`` (one row per notice key: a notice told again
after a restart is the same row), writes one audit record for it (``gate.opened``,
``gate.escalated``, ``gate.timed_out``: the agent as actor, no arguments or values), and, with
``STRATAGEM_GATE_WEBHOOK_URL`` set, POSTs it to the webhook until a 2xx answer, retried with a
growing delay (0.5 s doubling to 5 min) up to ``STRATAGEM_GATE_WEBHOOK_ATTEMPTS`` times. The
rows survive restarts: a restarted agent delivers what its predecessor had not.

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
import json
import logging
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from stratagem.agents import gate_info
from stratagem.planning import TIMEOUT_APPROVER, GateNotice
from stratagem.protocol import AuditLog
from stratagem.protocol._storage import StoreWorker
from stratagem.protocol._storage._sqlite import connect

__all__ = ["SIGNATURE_HEADER", "GateOutbox", "sign"]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER: Final = "X-Stratagem-Signature"
"""The header that carries ``v1=<hex HMAC-SHA256 of "<timestamp>." + body>``."""

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
        timeout_s: How long one delivery may take.
        send: Sends one delivery (tests may give their own); urllib's by default.
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
        self._send = send or _post
        self._worker = StoreWorker(f"stratagem-notices-{role}")
        self._conn: sqlite3.Connection | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

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
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self._worker.call(self._close)
        self._worker.stop()

    # --- delivery ------------------------------------------------------------------------------

    async def _deliver(self) -> None:
        assert self.url is not None
        while True:
            self._wake.clear()
            for key, body, attempts in await self._worker.call(self._due, time.time()):
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
                    status = await self._send(self.url, data, headers, self._timeout_s)
                except Exception as exc:  # the sender's own failure: counted as no answer
                    logger.warning("gate webhook %s: %s", key, exc)
                    status = 0
                await self._worker.call(self._mark, key, 200 <= status < 300, attempts + 1)
            soonest = await self._worker.call(self._soonest)
            wait = None if soonest is None else max(0.0, soonest - time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

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

    def _due(self, now: float) -> list[tuple[str, str, int]]:
        rows = self._db().execute(
            "SELECT key, body, attempts FROM notices WHERE delivered IS NULL AND given_up = 0 "
            "AND next_at <= ? ORDER BY created, key LIMIT 100",
            (now,),
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

    def _soonest(self) -> float | None:
        row = (
            self._db()
            .execute("SELECT min(next_at) FROM notices WHERE delivered IS NULL AND given_up = 0")
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


async def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST ``body`` with urllib on a thread; the status (0: no answer, or not HTTP)."""

    def send() -> int:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            logger.info("gate webhook %s: %s", url, exc)
            return 0

    return await asyncio.to_thread(send)
