"""The audit log: append-only, hash-chained, free of payloads and secrets.

Each record's ``hash`` is ``sha256(prev_hash + canonical JSON of the record without its hash)``,
where canonical JSON is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
and the first record's ``prev_hash`` is ``GENESIS``. Editing, deleting or reordering a record
therefore breaks the chain at that record, and ``verify_chain`` names the first one broken.
Removing records from the end shows only against a head kept elsewhere (``expected_head``).

A record holds the sha256 ``digest`` of a payload, never the payload, and a ``detail`` that is a
redacted one-line summary: whitespace collapsed, ``key=value`` secrets masked, length capped.

The stock logs: ``InMemoryAuditLog`` here, ``SqliteAuditLog`` (``_sqlite``) and
``PostgresAuditLog`` (``_postgres``), the last two committing through ``_group``.

``InMemoryAuditLog.append_async`` appends on the spot: no thread, no suspension.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring as _string
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "GENESIS",
    "MASK",
    "AsyncAuditLog",
    "AuditLog",
    "AuditRecord",
    "HoldingAuditLog",
    "InMemoryAuditLog",
    "digest",
    "redact",
    "redact_value",
]


GENESIS: Final = "0" * 64
"""The ``prev_hash`` of the first record."""

# The words that name a secret, in free text and as keys of structured values.
_SECRET_WORDS = r"password|passwd|secret|token|api[_-]?key|authorization|bearer|cookie"
# A secret-looking key and its value ("password=x", "token: x", "Authorization: Bearer x").
_SECRET = re.compile(
    rf"(?i)\b({_SECRET_WORDS})\b"
    r"(\s*[:=]\s*|\s+)(?:(?:bearer|basic)\s+)?\S+"
)
# A key of a structured value that names a secret ("password", "api_key", "access_token"; not
# "input_tokens").
_SECRET_KEY = re.compile(rf"(?i)(?<![a-z])({_SECRET_WORDS})(?![a-z])")
MASK: Final = "***"
"""What a redacted secret becomes."""
_TOKEN = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_.-]+")
# Text without whitespace, ':' or '=' is one line already and ``_SECRET`` cannot match it (a key
# must be followed by one of them): ids, names, codes and digests take this shortcut.
_PLAIN = re.compile(r"[^\s:=]*")
_DETAIL_LIMIT: Final = 240
_FIELD_LIMIT: Final = 128


def digest(data: bytes) -> str:
    """The hex sha256 of ``data``: what the audit log keeps instead of a payload."""
    return hashlib.sha256(data).hexdigest()


def _mask(match: re.Match[str]) -> str:
    return f"{match.group(1)}{match.group(2)}***"


def redact(text: str, limit: int = _DETAIL_LIMIT) -> str:
    """``text`` as one line: whitespace collapsed, ``key=value`` secrets masked, at most ``limit``.

    Args:
        text: Free text, e.g. an error message.
        limit: The maximum length of the result.

    Returns:
        The redacted line; ``password=hunter2`` becomes ``password=***`` and a signed token
        ``eyJ***``.
    """
    if _PLAIN.fullmatch(text) is not None:
        line = text
    else:
        line = _SECRET.sub(_mask, " ".join(text.split()))
    if "eyJ" in line:
        # A signed token (a JWT: ``protocol._identity``) is masked wherever it appears.
        line = _TOKEN.sub("eyJ***", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _masked(text: str) -> str:
    """``text`` with ``key=value`` secrets and signed tokens masked, its lines kept."""
    if _PLAIN.fullmatch(text) is None:
        text = _SECRET.sub(_mask, text)
    if "eyJ" in text:
        text = _TOKEN.sub("eyJ***", text)
    return text


def redact_value(value: Any) -> Any:
    """A JSON value with what the audit log redacts masked, by the same rules as ``redact``:
    the value under every key that names a secret (``password``, ``api_key``, ``access_token``,
    ``Authorization``...) becomes ``"***"``, and every string has its ``key=value`` secrets and
    signed tokens masked (its lines and length otherwise kept: cutting is the caller's).

    Args:
        value: Any JSON value (dicts, lists, strings, numbers, booleans, ``None``).

    Returns:
        A new value; ``value`` is not changed.
    """
    if isinstance(value, str):
        return _masked(value)
    if isinstance(value, dict):
        return {
            key: MASK
            if isinstance(key, str) and _SECRET_KEY.search(key) and item is not None
            else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value


def _canonical(fields: dict[str, object]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _chain_hash(
    prev_hash: str,
    seq: int,
    ts: str,
    actor: str,
    action: str,
    target: str,
    capability: str,
    request_id: str,
    code: str,
    detail: str,
    digest: str,
) -> str:
    """sha256(prev_hash + canonical JSON of the other fields), built without a dict.

    The same text as ``_canonical`` (keys in sorted order, each string as ``json.dumps`` writes it
    with ``ensure_ascii=False``) for the string fields and the int ``seq`` records hold; a record
    forged with values of other types takes ``_canonical`` itself.
    """
    canonical: str | None = None
    if type(seq) is int:
        try:
            canonical = (
                f'{{"action":{_string(action)},"actor":{_string(actor)},'
                f'"capability":{_string(capability)},"code":{_string(code)},'
                f'"detail":{_string(detail)},"digest":{_string(digest)},'
                f'"prev_hash":{_string(prev_hash)},"request_id":{_string(request_id)},'
                f'"seq":{seq!r},"target":{_string(target)},"ts":{_string(ts)}}}'
            )
        except TypeError:  # a field that is not a string
            canonical = None
    if canonical is None:
        fields: dict[str, object] = {
            "seq": seq,
            "ts": ts,
            "actor": actor,
            "action": action,
            "target": target,
            "capability": capability,
            "request_id": request_id,
            "code": code,
            "detail": detail,
            "digest": digest,
            "prev_hash": prev_hash,
        }
        canonical = _canonical(fields)
    return hashlib.sha256((prev_hash + canonical).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit record.

    Attributes:
        seq: Position in the log, from 1, without gaps.
        ts: When it was appended, ISO 8601 in UTC with microseconds.
        actor: Who acted: the caller's identity ("" when it sent none).
        action: What happened, e.g. ``call.accepted``, ``call.outcome``, ``call.denied``,
            ``call.refused``, ``call.replayed``.
        target: The agent acted upon.
        capability: The capability (or read RPC) involved.
        request_id: The request's idempotency key, when known.
        code: The status code name (``OK``, ``PERMISSION_DENIED``...), "" for ``call.accepted``.
        detail: A redacted one-line summary.
        digest: The sha256 of the payload involved (request or response bytes), "" when none.
        prev_hash: The previous record's ``hash`` (``GENESIS`` for the first).
        hash: sha256 of ``prev_hash`` + the canonical JSON of every other field.
    """

    seq: int
    ts: str
    actor: str
    action: str
    target: str
    capability: str
    request_id: str
    code: str
    detail: str
    digest: str
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        """The hash this record's contents call for (``hash``, unless it was tampered with)."""
        return _chain_hash(
            self.prev_hash,
            self.seq,
            self.ts,
            self.actor,
            self.action,
            self.target,
            self.capability,
            self.request_id,
            self.code,
            self.detail,
            self.digest,
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a caller appends: a record without its place in the chain."""

    actor: str
    action: str
    target: str
    capability: str
    request_id: str
    code: str
    detail: str
    digest: str

    def seal(self, seq: int, prev_hash: str) -> AuditRecord:
        ts = datetime.now(UTC).isoformat(timespec="microseconds")
        fields = (
            self.actor,
            self.action,
            self.target,
            self.capability,
            self.request_id,
            self.code,
            self.detail,
            self.digest,
        )
        return AuditRecord(seq, ts, *fields, prev_hash, _chain_hash(prev_hash, seq, ts, *fields))


def _entry(
    actor: str,
    action: str,
    target: str,
    capability: str,
    request_id: str,
    code: str,
    detail: str,
    digest: str,
) -> _Entry:
    """Every text field reduced to one line; ``detail`` redacted (see ``redact``)."""
    return _Entry(
        actor=redact(actor, _FIELD_LIMIT),
        action=redact(action, _FIELD_LIMIT),
        target=redact(target, _FIELD_LIMIT),
        capability=redact(capability, _FIELD_LIMIT),
        request_id=redact(request_id, 400),
        code=redact(code, _FIELD_LIMIT),
        detail=redact(detail),
        digest=redact(digest, _FIELD_LIMIT),
    )


class AuditLog(Protocol):
    """An append-only, hash-chained audit log (blocking; call it from a thread in async code)."""

    def append(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> AuditRecord:
        """Append a record, chained to the previous one; ``detail`` is redacted first."""
        ...

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order."""
        ...

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        ...


@runtime_checkable
class AsyncAuditLog(AuditLog, Protocol):
    """An ``AuditLog`` that async code can append to without blocking its event loop.

    ``AgentServer`` uses ``append_async`` when the log has it, and ``append`` in a worker thread
    otherwise.
    """

    def append_async(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> Awaitable[AuditRecord]:
        """Append like ``append``; the await returns once the record is stored (durably)."""
        ...


@runtime_checkable
class HoldingAuditLog(AsyncAuditLog, Protocol):
    """An ``AsyncAuditLog`` that can hold a record back until the next commit another record
    starts (``SqliteAuditLog``): the server hands it a ``Call``'s ``call.accepted`` so that it
    commits with the call's ``call.outcome``, one transaction per call."""

    def append_held(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> Awaitable[AuditRecord]:
        """Append like ``append_async``, committed with the next record not held (or soon)."""
        ...


class _ChainedLog:
    """``append`` for both stock logs; subclasses store a sealed record in ``_commit``."""

    def append(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> AuditRecord:
        """Append a record, chained to the previous one.

        Every text field is reduced to one line; ``detail`` is redacted (see ``redact``).

        Returns:
            The record as stored, with its ``seq``, ``ts`` and ``hash``.
        """
        entry = _entry(actor, action, target, capability, request_id, code, detail, digest)
        return self._commit(entry)

    def _commit(self, entry: _Entry) -> AuditRecord:
        raise NotImplementedError


class InMemoryAuditLog(_ChainedLog):
    """An audit log in a list: for tests and for runs that keep no state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[AuditRecord] = []

    async def append_async(
        self,
        *,
        actor: str,
        action: str,
        target: str = "",
        capability: str = "",
        request_id: str = "",
        code: str = "",
        detail: str = "",
        digest: str = "",
    ) -> AuditRecord:
        """``append``, on the spot: a list append needs no thread and never suspends."""
        return self.append(
            actor=actor,
            action=action,
            target=target,
            capability=capability,
            request_id=request_id,
            code=code,
            detail=detail,
            digest=digest,
        )

    def _commit(self, entry: _Entry) -> AuditRecord:
        with self._lock:
            last = self._records[-1] if self._records else None
            record = entry.seal(last.seq + 1 if last else 1, last.hash if last else GENESIS)
            self._records.append(record)
            return record

    def records(self) -> Iterator[AuditRecord]:
        """Every record, in ``seq`` order (a snapshot taken when called)."""
        with self._lock:
            return iter(list(self._records))

    def head(self) -> str:
        """The hash of the last record (``GENESIS`` when the log is empty)."""
        with self._lock:
            return self._records[-1].hash if self._records else GENESIS

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty (its ``seq`` and ``hash``: the head)."""
        with self._lock:
            return self._records[-1] if self._records else None


_COLUMNS: Final = tuple(field.name for field in dataclasses.fields(AuditRecord))


def _chain(entries: Sequence[_Entry], last: tuple[int, str] | None) -> list[AuditRecord]:
    """Seal ``entries`` in order after the record ``last`` names (``(seq, hash)``, or none)."""
    seq, prev_hash = last if last else (0, GENESIS)
    records = []
    for entry in entries:
        seq += 1
        record = entry.seal(seq, prev_hash)
        prev_hash = record.hash
        records.append(record)
    return records
