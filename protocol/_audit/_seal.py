"""Signed heads for the audit log: what a hash chain alone cannot show.

A hash chain shows an edited, deleted or reordered record, but not one rewritten by someone who
recomputes every later hash, nor a tail cut off the end. ``AuditSealer`` therefore signs the
chain's head now and then: it appends one JSON line per seal to a *heads file* next to the log::

    {"hash":"<hash of record seq>","mac":"<hex>","sealed_at":"<ISO 8601 UTC>","seq":<seq>}

where ``mac`` is HMAC-SHA256, under a key kept outside the database, of ``_MAC_DOMAIN`` followed
by the canonical JSON of ``{"hash", "sealed_at", "seq"}`` (sorted keys, no spaces). Whoever can
write the database but not read the key cannot forge a head, so ``verify_sealed`` compares every
signed head with the record now at its ``seq`` and names what changed:

* an edited record, a deleted record or a reordered pair (the hash chain breaks there; a deleted
  record is named as missing, a reordered one as out of place);
* a truncated tail: a signed head's record is missing, even when the remaining chain is intact;
* a rewritten chain (a record edited and every later hash recomputed, so ``verify_chain`` passes):
  a signed head no longer matches its record; the first changed record lies after the last signed
  head that still matches and at or before the first that does not;
* an edited heads file: a line whose MAC does not verify (the heads file is named by line).

What it cannot show, honestly:

* records appended after the last seal and then removed, or rewritten: nothing signed vouches for
  them. The window is bounded by the seal interval (``every_records`` / ``every_s``); the runtime
  also seals on shutdown to close it.
* where exactly, between two signed heads, a rewrite began (the original records are gone; only
  the bounds are known).
* lines removed from the end of the heads file: the heads file itself is append-only but not
  sealed, so an attacker who also cuts its last lines widens the undetectable window back to the
  last seal left. Copying every head somewhere the attacker cannot write (``MirroredHeads``)
  closes that gap.
* an attacker who holds the key: they can sign whatever they like.

A missing or empty heads file next to a non-empty log fails verification (deleting the heads file
must not silence it); a log that was never sealed therefore fails too, which is the point.

After an operating-system crash, a log written with ``synchronous="normal"`` may have lost its last
commits while a seal of them reached the disk: ``verify_sealed`` then reports the truncation that
really happened. Sealing with ``fsync=True`` on a ``synchronous="full"`` log keeps both in step.

Several processes may seal one log into one heads file: each line is written with a single
``os.write`` on an ``O_APPEND`` descriptor, so lines never interleave; heads may appear out of
``seq`` order and more than once, and verification does not mind.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from stratagem.protocol._audit._heads import HeadsStore, _heads_store
from stratagem.protocol._audit._log import (
    GENESIS,
    AuditLog,
    AuditRecord,
)
from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "KEY_BYTES",
    "AuditSealer",
    "SealableAuditLog",
    "SignedHead",
    "load_or_create_key",
]

logger = logging.getLogger(__name__)

KEY_BYTES: Final = 32
"""The length of a key ``load_or_create_key`` creates."""

# Binds a MAC to this use, so a key shared with another purpose (a cluster secret) cannot be
# tricked into vouching for a head by a MAC computed elsewhere, nor the other way round.
_MAC_DOMAIN: Final = b"stratagem.audit.signed-head.v1\n"
_MIN_KEY_BYTES: Final = 16
_HEX = frozenset("0123456789abcdef")


@runtime_checkable
class SealableAuditLog(AuditLog, Protocol):
    """An ``AuditLog`` that reads its last record cheaply (both stock logs do).

    ``AuditSealer`` uses ``last`` when a log has it and walks ``records()`` otherwise.
    """

    def last(self) -> AuditRecord | None:
        """The last record, ``None`` when the log is empty."""
        ...


@dataclass(frozen=True, slots=True)
class SignedHead:
    """One signed head: the chain's last ``seq`` and ``hash`` when it was sealed.

    Attributes:
        seq: The ``seq`` of the last record sealed.
        hash: That record's ``hash``.
        sealed_at: When it was sealed, ISO 8601 in UTC with microseconds.
        mac: Hex HMAC-SHA256 of the other three (see the module docstring).
    """

    seq: int
    hash: str
    sealed_at: str
    mac: str

    def line(self) -> bytes:
        """The head as one line of the heads file, newline included."""
        fields = {"hash": self.hash, "mac": self.mac, "sealed_at": self.sealed_at, "seq": self.seq}
        return (json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")

    def verifies(self, key: bytes) -> bool:
        """Whether ``mac`` is the MAC of the other fields under ``key`` (in constant time)."""
        return hmac.compare_digest(self.mac, _mac(key, self.seq, self.hash, self.sealed_at))


def _mac(key: bytes, seq: int, hash: str, sealed_at: str) -> str:
    canonical = json.dumps(
        {"hash": hash, "sealed_at": sealed_at, "seq": seq}, sort_keys=True, separators=(",", ":")
    )
    return hmac.new(key, _MAC_DOMAIN + canonical.encode("ascii"), hashlib.sha256).hexdigest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < _MIN_KEY_BYTES:
        raise ProtocolUsageError(
            f"an audit sealing key must be at least {_MIN_KEY_BYTES} bytes (use load_or_create_key)"
        )


def _is_hex64(text: str) -> bool:
    return len(text) == 64 and _HEX.issuperset(text)


def _parse_head(line: bytes) -> SignedHead | None:
    """The head on ``line``, or ``None`` when it is not a well-formed head line."""
    try:
        fields = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None
    if not isinstance(fields, dict) or set(fields) != {"seq", "hash", "sealed_at", "mac"}:
        return None
    seq, hash, sealed_at, mac = fields["seq"], fields["hash"], fields["sealed_at"], fields["mac"]
    if type(seq) is not int or seq < 1:
        return None
    if not (isinstance(hash, str) and isinstance(sealed_at, str) and isinstance(mac, str)):
        return None
    if not (_is_hex64(hash) and _is_hex64(mac)):
        return None
    return SignedHead(seq=seq, hash=hash, sealed_at=sealed_at, mac=mac)


def load_or_create_key(path: Path) -> bytes:
    """The sealing key in ``path``, created (``KEY_BYTES`` random bytes, mode 0600) when missing.

    Creation is atomic: the key is written to a temporary file opened with ``O_CREAT | O_EXCL``
    and mode 0600, then linked to ``path``; a process racing another reads the winner's key and
    never a partly written one. The folder is created (mode 0700) when missing.

    Args:
        path: Where the key lives, outside the audit database (e.g. ``STATE_DIR/audit.key``).

    Returns:
        The key.

    Raises:
        ProtocolUsageError: When the file is not a regular file, is readable or writable by its
            group or others, or does not hold exactly ``KEY_BYTES`` bytes.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create_key(path)
    return _read_key(path)


def _create_key(path: Path) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)  # fails when another process created the key first
        except FileExistsError:
            return
        _fsync_folder(path.parent)
        logger.info("created the audit sealing key %s", path)
    finally:
        temporary.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ProtocolUsageError(f"cannot read the audit sealing key {path}: {exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProtocolUsageError(f"the audit sealing key {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ProtocolUsageError(
                f"the audit sealing key {path} has mode {mode:04o}: its group or others may "
                f"read or change it; refusing it (run: chmod 600 {path})"
            )
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ProtocolUsageError(
            f"the audit sealing key {path} holds {len(key)} bytes, not {KEY_BYTES}"
        )
    return key


def _last_of(log: AuditLog) -> tuple[int, str]:
    """The ``seq`` and ``hash`` of the log's last record; ``(0, GENESIS)`` when it is empty."""
    if isinstance(log, SealableAuditLog):
        record = log.last()
    else:
        # A log without ``last``: walk it (linear; implement ``last`` to make sealing cheap).
        tail = collections.deque(log.records(), maxlen=1)
        record = tail[0] if tail else None
    return (record.seq, record.hash) if record is not None else (0, GENESIS)


class AuditSealer:
    """Signs the head of an audit log into an append-only heads file.

    Thread-safe; several processes may seal one log into one heads file (see the module
    docstring). ``seal`` and ``maybe_seal`` block (a read of the log's head, a write to the
    heads file): async code calls them from a thread, e.g. right after ``append``.

    Args:
        log: Any ``AuditLog``; one with ``last()`` (``SealableAuditLog``) reads its head cheaply.
        key: The HMAC key, kept outside the database (``load_or_create_key``, or derived from a
            secret); at least 16 bytes.
        heads_path: The heads file (created with mode 0600 when missing, only ever appended to),
            or another ``HeadsStore`` (e.g. a table every node of a cluster reaches).
        every_records: ``maybe_seal`` seals once this many records were appended since the last
            seal.
        every_s: ... or once this many seconds passed since the last seal.
        clock: Seconds since the epoch (``time.time``); tests pass a fake.
        fsync: Whether each seal is fsynced (pair it with a ``synchronous="full"`` log).

    Raises:
        ProtocolUsageError: When the key is too short or a threshold is not positive.
    """

    def __init__(
        self,
        log: AuditLog,
        key: bytes,
        heads_path: Path | HeadsStore,
        *,
        every_records: int = 64,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        fsync: bool = False,
    ) -> None:
        _check_key(key)
        if every_records < 1 or not every_s > 0:
            raise ProtocolUsageError("every_records and every_s must be positive")
        self._log = log
        self._key = key
        self._heads = _heads_store(heads_path, fsync=fsync)
        self._every_records = every_records
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sealed: tuple[int, str] = self._last_signed()
        self._sealed_at = clock()
        self._appended = 0

    @property
    def heads(self) -> HeadsStore:
        """Where the heads go."""
        return self._heads

    def _last_signed(self) -> tuple[int, str]:
        """The last head in the heads file that verifies, so a restart does not seal it again.

        Only a verified head counts: a forged line claiming a far-ahead ``seq`` must not stop
        this sealer from sealing.
        """
        lines = self._heads.tail().split(b"\n")
        for line in reversed(lines):
            head = _parse_head(line)
            if head is not None and head.verifies(self._key):
                return (head.seq, head.hash)
        return (0, GENESIS)

    def seal(self) -> SignedHead | None:
        """Sign the log's current head and append it to the heads file.

        Returns:
            The head signed, or ``None`` when the log is empty or its head is the one this
            sealer signed last.
        """
        with self._lock:
            seq, hash = _last_of(self._log)
            self._appended = 0
            self._sealed_at = self._clock()
            if seq == 0 or (seq, hash) == self._sealed:
                return None
            sealed_at = datetime.fromtimestamp(self._sealed_at, UTC).isoformat(
                timespec="microseconds"
            )
            head = SignedHead(seq, hash, sealed_at, _mac(self._key, seq, hash, sealed_at))
            self._heads.append(head.line())
            self._sealed = (seq, hash)
        logger.debug("sealed the audit head at seq %s into %s", seq, self._heads.where)
        return head

    def maybe_seal(self, appended: int = 1) -> SignedHead | None:
        """Seal when ``every_records`` records or ``every_s`` seconds passed since the last seal.

        Cheap enough to call after every append: it touches neither the log nor the heads file
        until a threshold is reached.

        Args:
            appended: How many records the caller appended since its previous call.

        Returns:
            The head signed, or ``None`` when no threshold was reached or nothing is new.
        """
        with self._lock:
            self._appended += appended
            due = (
                self._appended >= self._every_records
                or self._clock() - self._sealed_at >= self._every_s
            )
        return self.seal() if due else None
