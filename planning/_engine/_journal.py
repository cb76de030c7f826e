"""The run's journal: one store commit per scheduler tick."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from stratagem.planning._errors import StoreError
from stratagem.planning._store import Record, StateStore

logger = logging.getLogger(__name__)


class _Journal:
    """Groups one run's records into one store commit per scheduler tick.

    ``add`` appends records to the open batch and returns the batch's future, which completes
    once the batch is committed. The flusher commits a batch, then the next one with everything
    added meanwhile, so the records of every transition during one loop iteration (or during one
    commit) share one transaction. A batch future never carries an exception: a waiter checks
    ``error`` after it completes.
    """

    def __init__(
        self,
        store: StateStore,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self.loop = loop
        self.on_failure = on_failure
        self.records: list[Record] = []
        self.future: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.closed = False

    def add(self, *records: Record) -> asyncio.Future[None]:
        """Queue ``records`` for the next commit; the future completes when they are committed."""
        future = self.future
        if future is None:
            future = self.future = self.loop.create_future()
        if self.closed or self.error is not None:
            return future  # never completes: the run is being torn down
        self.records.extend(records)
        if self.task is None:
            self.task = self.loop.create_task(self._flush())
        return future

    async def write(self, *records: Record) -> None:
        """Queue ``records`` and wait until they are committed.

        Raises:
            StoreError: When the store failed.
        """
        if self.error is None:
            await self.add(*records)
        if self.error is not None:
            raise self.error

    async def flush(self) -> None:
        """Wait until everything queued is committed.

        Raises:
            StoreError: When the store failed.
        """
        while self.task is not None:
            await asyncio.shield(self.task)
        if self.error is not None:
            raise self.error

    async def abort(self) -> None:
        """Drop what is not committed yet and wait for a commit in progress (an interruption)."""
        self.closed = True
        self.records = []
        task = self.task
        if task is not None:
            await asyncio.wait([task])

    async def _flush(self) -> None:
        try:
            while self.records and not self.closed:
                records, future = self.records, self.future
                self.records, self.future = [], None
                try:
                    await self.store.commit(records)
                except Exception as exc:
                    logger.error("state store commit failed: %s", exc)
                    self.error = exc if isinstance(exc, StoreError) else StoreError(str(exc))
                    self.on_failure(self.error)
                    if future is not None:
                        future.set_result(None)
                    return
                if future is not None:
                    future.set_result(None)
        finally:
            self.task = None
