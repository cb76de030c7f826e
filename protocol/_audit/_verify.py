"""Verification: the hash chain recomputed, and the first broken record named.

``verify_chain`` checks the chain alone; ``verify_sealed`` (below) checks it against the signed
heads an ``AuditSealer`` wrote (``_seal``), which also shows a cut tail or a rewritten chain.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stratagem.protocol._audit._heads import HeadsStore, _heads_store
from stratagem.protocol._audit._log import GENESIS, AuditRecord
from stratagem.protocol._audit._seal import SignedHead, _check_key, _parse_head

__all__ = ["ChainVerdict", "verify_chain", "verify_sealed"]

logger = logging.getLogger(__name__)

# How far verification looks around a broken record to tell a moved record from an edited one,
# and ahead of it to tell a deleted record from one that comes later.
_DIAGNOSE_WINDOW: Final = 64


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """The result of ``verify_chain``.

    Attributes:
        ok: Whether the whole chain is intact.
        count: How many records verified before the first broken one (all of them when ``ok``).
        first_broken_seq: The ``seq`` of the first broken record (for a truncated tail, the first
            missing one), or ``None`` when ``ok`` (or when no record is to blame: ``heads_line``).
        reason: Why it is broken, one line; "" when ``ok``.
        sealed: How many signed heads verified (``verify_sealed``;
            always 0 from ``verify_chain``).
        heads_line: The line of the signed-heads file that does not verify, when that is what
            broke (``verify_sealed``); ``None`` otherwise.
    """

    ok: bool
    count: int
    first_broken_seq: int | None = None
    reason: str = ""
    sealed: int = 0
    heads_line: int | None = None


def verify_chain(
    records: Iterable[AuditRecord], *, expected_head: str | None = None
) -> ChainVerdict:
    """Recompute the hash chain and name the first broken record.

    Args:
        records: The records in ``seq`` order, e.g. ``log.records()``.
        expected_head: A head hash kept elsewhere; when given, a chain that does not end there was
            cut short.

    Returns:
        The verdict: edited records fail their own hash, deleted or reordered ones break the
        ``seq`` sequence or the ``prev_hash`` link.
    """
    prev_seq, prev_hash, count = 0, GENESIS, 0
    for record in records:
        reason = ""
        if record.hash != record.expected_hash():
            reason = "its hash does not match its contents: the record was edited"
        elif record.seq != prev_seq + 1:
            reason = f"seq {record.seq} follows seq {prev_seq}: records are missing or out of order"
        elif record.prev_hash != prev_hash:
            reason = "its prev_hash is not the previous record's hash: a record before it changed"
        if reason:
            logger.warning("audit chain broken at seq %s: %s", record.seq, reason)
            return ChainVerdict(ok=False, count=count, first_broken_seq=record.seq, reason=reason)
        prev_seq, prev_hash, count = record.seq, record.hash, count + 1
    if expected_head is not None and prev_hash != expected_head:
        reason = f"the chain ends at seq {prev_seq}, before the expected head: records were removed"
        return ChainVerdict(ok=False, count=count, first_broken_seq=prev_seq + 1, reason=reason)
    return ChainVerdict(ok=True, count=count)


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
