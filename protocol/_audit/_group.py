"""Group commit: the records of concurrent appends committed together, by one writer thread.

A durable log's ``append_async`` hands its record to the log's writer (its ``StoreWorker``), which
commits whatever is queued in one transaction (up to ``_MAX_BATCH`` records): the first record
queued posts one drain job, and a drain takes every record queued by the time it runs. Each
caller's future settles on its own event loop once the transaction holding its record committed,
or with the exception that kept it from being stored. ``SqliteAuditLog`` commits on the event loop
first and uses the writer only when the lock is busy; ``PostgresAuditLog`` always uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from stratagem.protocol._audit._log import AuditRecord, _ChainedLog, _Entry, _entry
from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._storage import StoreWorker

__all__: list[str] = []

logger = logging.getLogger(__name__)

# The most records one group commit writes; more wait for the next transaction.
_MAX_BATCH: Final = 512


@dataclass(frozen=True, slots=True)
class _Pending:
    """A record handed to the writer thread, and where to report that it was committed."""

    entry: _Entry
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[AuditRecord]


def _resolve(
    outcomes: list[tuple[asyncio.Future[AuditRecord], AuditRecord | BaseException]],
) -> None:
    """Settle the futures of one batch (on their event loop); a cancelled waiter is skipped."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class _GroupCommitLog(_ChainedLog):
    """A log whose ``append_async`` hands records to one writer thread that commits whatever is
    queued in one transaction (group commit); subclasses write a batch in ``_commit_many``.

    Subclasses call ``_start_queue(label)`` in their constructor and ``_stop_writer()`` when they
    close.
    """

    _label: str
    _lock: threading.Lock
    _worker: StoreWorker
    _queued: list[_Pending]
    _queue_lock: threading.Lock
    _closed: bool

    def _start_queue(self, label: str) -> None:
        self._label = label
        self._lock = threading.Lock()
        self._worker = StoreWorker(f"audit-writer {label}")
        self._queued = []
        self._queue_lock = threading.Lock()
        self._closed = False

    @property
    def _writer(self) -> threading.Thread | None:
        """The writer's thread, ``None`` until something was handed to it."""
        return self._worker.thread

    def _commit(self, entry: _Entry) -> AuditRecord:
        [record] = self._commit_many([entry])
        return record

    def _commit_many(self, entries: Sequence[_Entry]) -> list[AuditRecord]:
        raise NotImplementedError

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
    ) -> asyncio.Future[AuditRecord]:
        """Append like ``append`` without blocking the event loop: the writer thread commits it.

        Records appended by concurrent callers are committed together in one transaction (group
        commit). Once handed over, the record is written even when the awaiting task is cancelled.

        Returns:
            A future of the event loop that settles once the transaction holding the record has
            committed: the stored record, or the exception that kept it from being stored.

        Raises:
            ProtocolUsageError: When the log is closed.
        """
        return self._to_writer(
            _entry(actor, action, target, capability, request_id, code, detail, digest)
        )

    def _to_writer(self, entry: _Entry) -> asyncio.Future[AuditRecord]:
        """Hand ``entry`` to the writer thread; the future settles once it is committed."""
        if self._closed:
            raise ProtocolUsageError(f"the audit log {self._label} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AuditRecord] = loop.create_future()
        self._hand_to_writer(_Pending(entry, loop, future))
        return future

    def _hand_to_writer(self, pending: _Pending) -> None:
        """Queue a record for the writer; the first one queued posts the drain that takes them."""
        with self._queue_lock:
            self._queued.append(pending)
            first = len(self._queued) == 1
        if first:
            self._worker.post(self._drain)

    def _drain(self) -> None:
        """On the writer: commit the records queued by now (up to ``_MAX_BATCH``) together."""
        with self._queue_lock:
            batch = self._queued[:_MAX_BATCH]
            del self._queued[:_MAX_BATCH]
            more = bool(self._queued)
        if more:
            self._worker.post(self._drain)
        if not batch:
            return
        outcomes: list[AuditRecord] | BaseException
        try:
            outcomes = self._commit_many([pending.entry for pending in batch])
        except Exception as exc:
            logger.error("cannot write %d audit records to %s: %s", len(batch), self._label, exc)
            outcomes = exc
        _report(batch, outcomes)

    def _stop_writer(self) -> None:
        """Refuse new records, then let the writer commit the ones already queued and end."""
        self._closed = True
        self._worker.stop()


def _report(
    batch: list[_Pending],
    outcomes: list[AuditRecord] | BaseException,
    here: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Settle a batch's futures, each on its own event loop: at once for the loop ``here`` (the
    one running this code), through ``call_soon_threadsafe`` for any other."""
    by_loop: dict[
        asyncio.AbstractEventLoop,
        list[tuple[asyncio.Future[AuditRecord], AuditRecord | BaseException]],
    ] = {}
    for index, pending in enumerate(batch):
        outcome = outcomes if isinstance(outcomes, BaseException) else outcomes[index]
        by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, settled in by_loop.items():
        if loop is here:
            _resolve(settled)
            continue
        # A closed loop has nobody waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, settled)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
