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
import dataclasses
import hashlib
import hmac
import itertools
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from stratagem.protocol._audit import GENESIS, AuditLog, AuditRecord, ChainVerdict, verify_chain
from stratagem.protocol._errors import ProtocolUsageError

__all__ = [
    "KEY_BYTES",
    "AuditSealer",
    "FileHeads",
    "HeadsStore",
    "MirroredHeads",
    "SealableAuditLog",
    "SignedHead",
    "load_or_create_key",
    "verify_sealed",
]

logger = logging.getLogger(__name__)

KEY_BYTES: Final = 32
"""The length of a key ``load_or_create_key`` creates."""

# Binds a MAC to this use, so a key shared with another purpose (a cluster secret) cannot be
# tricked into vouching for a head by a MAC computed elsewhere, nor the other way round.
_MAC_DOMAIN: Final = b"stratagem.audit.signed-head.v1\n"
_MIN_KEY_BYTES: Final = 16
# How far verification looks around a broken record to tell a moved record from an edited one,
# and ahead of it to tell a deleted record from one that comes later.
_DIAGNOSE_WINDOW: Final = 64
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


class HeadsStore(Protocol):
    """Where signed heads are kept: appended to, read whole. A file (``FileHeads``) by default; a
    table of the store's database (``PostgresAuditHeads``) where nodes share no file system."""

    where: str
    """Where the heads are, for people (a path, or a database without its password)."""

    def append(self, line: bytes) -> None:
        """Add one signed-head line (it ends with a newline)."""

    def read(self) -> bytes | None:
        """Every line, in the order appended; ``None`` when no heads were ever kept here."""

    def tail(self) -> bytes:
        """The last lines (a few KiB at most): where a restarted sealer finds its last head."""


class FileHeads:
    """Signed heads in an append-only file (mode 0600), the default beside a SQLite log.

    Args:
        path: The file; created when missing, only ever appended to.
        fsync: Whether each append is fsynced.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self._fsync = fsync

    def append(self, line: bytes) -> None:
        """Append ``line`` with one write on an O_APPEND descriptor (lines never interleave)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> bytes | None:
        """The file's bytes, or ``None`` when it is missing."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def tail(self) -> bytes:
        """The file's last 4 KiB (empty when missing)."""
        try:
            with self.path.open("rb") as file:
                size = file.seek(0, os.SEEK_END)
                file.seek(max(0, size - 4096))
                return file.read()
        except FileNotFoundError:
            return b""


class MirroredHeads:
    """Signed heads kept in a primary store and copied to another (an external sink).

    Every seal is appended to ``primary`` and then to ``copy``, say a file on another disk or a
    mount that whoever can write the state directory cannot rewrite. Reading gives the primary's
    lines followed by the copy's lines the primary lacks, so heads cut from the end of the primary
    (which its own chain cannot show) still verify against the log, and a rewritten log fails
    them. A copy that cannot be written is logged and sealing goes on (the primary has the head).

    Args:
        primary: Where heads are read first (the file beside the log, or the database table).
        copy: The second place every head is appended to.
    """

    def __init__(self, primary: HeadsStore, copy: HeadsStore) -> None:
        self.primary = primary
        self.copy = copy
        self.where = f"{primary.where} (copied to {copy.where})"

    def append(self, line: bytes) -> None:
        self.primary.append(line)
        try:
            self.copy.append(line)
        except OSError as exc:
            logger.warning("cannot copy a signed audit head to %s: %s", self.copy.where, exc)

    def read(self) -> bytes | None:
        first, second = self.primary.read(), self.copy.read()
        if first is None and second is None:
            return None
        kept = (first or b"").splitlines(keepends=True)
        if kept and not kept[-1].endswith(b"\n"):
            kept[-1] += b"\n"
        seen = set(kept)
        extra = [line for line in (second or b"").splitlines(keepends=True) if line not in seen]
        if extra and not extra[-1].endswith(b"\n"):
            extra[-1] += b"\n"
        return b"".join(kept + extra)

    def tail(self) -> bytes:
        return self.primary.tail()


def _heads_store(heads: Path | HeadsStore, *, fsync: bool = False) -> HeadsStore:
    if isinstance(heads, (str, os.PathLike)):
        return FileHeads(Path(heads), fsync=fsync)
    return heads


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


def _read_heads(
    heads_store: HeadsStore, key: bytes
) -> tuple[list[tuple[int, SignedHead]], int | None] | None:
    """The heads that verify, each with its line number, and the first line that does not.

    ``None`` when no heads were ever kept there.
    """
    data = heads_store.read()
    if data is None:
        return None
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    heads: list[tuple[int, SignedHead]] = []
    bad: int | None = None
    for number, line in enumerate(lines, start=1):
        head = _parse_head(line)
        if head is not None and head.verifies(key):
            heads.append((number, head))
        elif bad is None:
            bad = number
    return heads, bad


class _Tap:
    """Passes records to ``verify_chain`` and keeps what the signed heads need."""

    def __init__(self, records: Iterable[AuditRecord], sealed_seqs: set[int]) -> None:
        self._records = iter(records)
        self._sealed_seqs = sealed_seqs
        self.hashes: dict[int, str] = {}
        self.previous: AuditRecord | None = None
        self.current: AuditRecord | None = None

    def __iter__(self) -> Iterator[AuditRecord]:
        return self

    def __next__(self) -> AuditRecord:
        record = next(self._records)
        self.previous, self.current = self.current, record
        if record.seq in self._sealed_seqs:
            self.hashes.setdefault(record.seq, record.hash)
        return record

    def ahead(self, count: int) -> list[AuditRecord]:
        """Up to ``count`` records after the current one (read past where the chain broke)."""
        return list(itertools.islice(self._records, count))


def _diagnose(verdict: ChainVerdict, tap: _Tap) -> tuple[int, str]:
    """Name the record behind a broken chain more precisely than ``verify_chain`` can alone."""
    broken = tap.current
    if broken is None or type(broken.seq) is not int or broken.seq != verdict.first_broken_seq:
        return verdict.first_broken_seq or 0, verdict.reason
    seq = broken.seq
    prev_seq = tap.previous.seq if tap.previous is not None else 0
    if broken.hash != broken.expected_hash():
        # A record moved to another seq (rows swapped in the database) still matches its hash
        # at the seq it was written with.
        for written in range(max(1, seq - _DIAGNOSE_WINDOW), seq + _DIAGNOSE_WINDOW + 1):
            if written != seq and dataclasses.replace(broken, seq=written).expected_hash() == (
                broken.hash
            ):
                low, high = sorted((seq, written))
                return seq, (
                    f"record {seq} is the record written as seq {written}: records {low} and "
                    f"{high} were reordered"
                )
        return seq, f"record {seq} was edited: its hash does not match its contents"
    if seq > prev_seq + 1:
        missing = range(prev_seq + 1, seq)
        later = next((r.seq for r in tap.ahead(_DIAGNOSE_WINDOW) if r.seq in missing), None)
        if later is not None:
            return prev_seq + 1, (
                f"record {later} comes after record {seq}: records were reordered"
                f" (seq {seq} follows seq {prev_seq})"
            )
        named = (
            f"record {missing[0]} is"
            if len(missing) == 1
            else (f"records {missing[0]}..{missing[-1]} are")
        )
        return prev_seq + 1, f"{named} missing: seq {seq} follows seq {prev_seq} (deleted)"
    if seq <= prev_seq:
        return seq, f"record {seq} comes after record {prev_seq}: records were reordered"
    return seq, (
        f"record {seq} does not link to record {prev_seq}: its prev_hash is not that record's "
        "hash, so one of them was rewritten with a recomputed hash"
    )


def verify_sealed(
    records: Iterable[AuditRecord], heads_path: Path | HeadsStore, key: bytes
) -> ChainVerdict:
    """Verify the hash chain, then every signed head in ``heads_path``, and name what changed.

    Records are read once, in order (a log of any size streams through).

    Args:
        records: The records in ``seq`` order, e.g. ``log.records()``.
        heads_path: The heads file an ``AuditSealer`` wrote, or its other ``HeadsStore``.
        key: The key it signed with.

    Returns:
        The verdict; ``sealed`` counts the signed heads that verified (those before the break
        when broken). The first problem in this order is reported: a broken chain (an edited,
        deleted or reordered record), a heads-file line that does not verify (``heads_line``),
        then, by ``seq``, a signed head whose record is missing (a truncated tail) or differs (a
        rewritten chain). A missing heads file fails a non-empty log.

    Raises:
        ProtocolUsageError: When the key is too short.
    """
    _check_key(key)
    heads_store = _heads_store(heads_path)
    read = _read_heads(heads_store, key)
    heads, bad_line = read if read is not None else ([], None)
    tap = _Tap(records, {head.seq for _, head in heads})
    chain = verify_chain(tap)

    def matching(before: int | None) -> int:
        return sum(
            1
            for _, head in heads
            if (before is None or head.seq < before) and tap.hashes.get(head.seq) == head.hash
        )

    if not chain.ok:
        seq, reason = _diagnose(chain, tap)
        logger.warning("audit chain broken at seq %s: %s", seq, reason)
        return ChainVerdict(
            ok=False, count=chain.count, first_broken_seq=seq, reason=reason, sealed=matching(seq)
        )
    last_seq = tap.current.seq if tap.current is not None else 0
    if bad_line is not None:
        reason = f"signed head line {bad_line} does not verify: the heads file was edited"
        logger.warning("audit heads %s: %s", heads_store.where, reason)
        return ChainVerdict(
            ok=False, count=chain.count, reason=reason, sealed=matching(None), heads_line=bad_line
        )
    if not heads and last_seq > 0:
        what = "missing" if read is None else "empty"
        reason = (
            f"the heads file {heads_store.where} is {what}: no signed head vouches for records "
            f"1..{last_seq} (the heads file was deleted or emptied, or the log was never sealed)"
        )
        return ChainVerdict(ok=False, count=chain.count, first_broken_seq=1, reason=reason)
    vouched = 0  # the last seq a signed head confirmed so far
    for sealed, (number, head) in enumerate(sorted(heads, key=lambda item: item[1].seq)):
        found = tap.hashes.get(head.seq)
        if found == head.hash:
            vouched = head.seq
            continue
        if head.seq > last_seq:
            reason = (
                f"truncated: record {head.seq} (signed at {head.sealed_at}) is missing; the log "
                f"ends at seq {last_seq}"
            )
            first = last_seq + 1
        else:
            # Two heads of one seq that disagree: the record changed after the first was signed.
            first = min(vouched + 1, head.seq)
            where = (
                f"record {head.seq} itself"
                if first == head.seq
                else f"between records {first} and {head.seq}"
            )
            reason = (
                f"the chain was rewritten: record {head.seq} (signed at {head.sealed_at}, heads "
                f"line {number}) has another hash; the first changed record is {where}"
            )
        logger.warning("audit chain broken at seq %s: %s", first, reason)
        return ChainVerdict(
            ok=False, count=chain.count, first_broken_seq=first, reason=reason, sealed=sealed
        )
    return ChainVerdict(ok=True, count=chain.count, sealed=len(heads))
