"""``StoreWorker``: the one thread a store owns for the work that must not run on an event loop.

A store whose calls would block (waiting for another process's write lock, an fsync, a checkpoint,
a prune) hands them to its worker: one thread, started on first use, that runs jobs one after
another in the order they were given. The state store's ``threaded=True`` runs every call there;
the answer store runs there what cannot run on the loop; the audit log commits there the records a
busy lock or ``synchronous="full"`` keeps off the loop (group commit) and checkpoints its WAL.

``call`` awaits a job's result on the caller's event loop (handed back with
``call_soon_threadsafe``; a loop closed meanwhile has nobody waiting); ``call_blocking`` waits for
it on a thread that is not the worker; ``post`` does not wait (an exception is logged). ``stop``
lets the jobs given before it run, then ends the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StoreWorker"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StoreWorker:
    """One thread that runs a store's jobs in order.

    Args:
        name: The thread's name (shown in thread dumps and logs).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The worker's thread, ``None`` until the first job."""
        return self._thread

    def _put(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_run, args=(self, self._jobs), name=self.name, daemon=True
                )
                self._thread.start()
            self._jobs.put(job)

    def is_current(self) -> bool:
        """Whether the calling thread is this worker's (also while it ends, after ``stop``)."""
        return getattr(_here, "worker", None) is self

    def post(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the worker without waiting for it; an exception it raises is logged."""

        def job() -> None:
            try:
                fn()
            except Exception:
                logger.exception("%s: a job failed", self.name)

        self._put(job)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker, after the jobs before it; its result or its exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                _hand_back(loop, _set_exception, future, exc)
            else:
                _hand_back(loop, _set_result, future, result)

        self._put(job)
        return await future

    def call_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker, waited for on this thread (never the worker's own)."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(result)

        self._put(job)
        return done.result()

    def stop(self, *, wait: bool = True) -> None:
        """End the thread after the jobs given before; with ``wait``, until it has ended.

        A job given later starts a new thread (a store refuses calls once closed, so only its
        own closing work does).
        """
        with self._lock:
            thread, jobs = self._thread, self._jobs
            if thread is None:
                return
            self._thread, self._jobs = None, queue.SimpleQueue()
        jobs.put(None)
        if wait and thread is not threading.current_thread():
            thread.join()


_here = threading.local()


def _run(worker: StoreWorker, jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
    """The worker's thread: run jobs in order until the end marker."""
    _here.worker = worker
    while (job := jobs.get()) is not None:
        job()


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    setter: Callable[[asyncio.Future[Any], Any], None],
    future: asyncio.Future[Any],
    value: Any,
) -> None:
    try:
        loop.call_soon_threadsafe(setter, future, value)
    except RuntimeError:  # the loop is closed: nobody waits any more
        logger.debug("a store's result arrived after its event loop closed")


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
