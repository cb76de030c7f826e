"""The deployment's memory as an operator uses it: ``MemoryClient`` (async) and
``SyncMemoryClient`` (blocking, the same methods), which the CLI's ``stratagem memory`` and the
console read.

The client opens the deployment's memory store itself (``STATE_DIR/memory.sqlite3``, or the
``stratagem`` schema of ``STRATAGEM_STORE_URL``): no agent needs to run. It acts as ``caller``
(``operator`` by default) under the deployment's policy (``STRATAGEM_POLICY_FILE`` or the shipped
one: its ``[[memory]]`` rules), and each write goes to the deployment's audit log. Bad input raises
``InputError`` (one line naming the field: exit 2 in the CLI); a namespace the caller may not
touch raises ``MemoryAccessError`` (exit 1); nothing is written then. A store that fails raises
``protocol.StorageError``, an embeddings endpoint that fails ``StratagemRuntimeError`` (exit 1).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from stratagem.agents import (
    EmbeddingError,
    MemoryDeniedError,
    MemoryInputError,
    MemoryItem,
    PolicedMemory,
    parse_namespace,
)
from stratagem.agents._memory import JsonValue
from stratagem.protocol import OPERATOR, Policy
from stratagem.runtime.config._errors import InputError, StratagemRuntimeError
from stratagem.runtime.config._memory import open_memory_store
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._stores import open_audit_log
from stratagem.runtime.operator._operator import operator_settings

if TYPE_CHECKING:
    from stratagem.agents import MemoryStore

__all__ = ["MemoryAccessError", "MemoryClient", "SyncMemoryClient"]

T = TypeVar("T")


class MemoryAccessError(StratagemRuntimeError):
    """The policy does not let the caller read or write a namespace (one line naming it)."""


def _namespace(namespace: str | Sequence[str]) -> tuple[str, ...]:
    return parse_namespace(namespace) if isinstance(namespace, str) else tuple(namespace)


class MemoryClient:
    """The deployment's memory, as ``caller`` may use it.

    Args:
        state_dir: The deployment's state directory (found as the CLI finds it when ``None``).
        profile: A profile of the config file.
        settings: Settings made already (instead of ``state_dir`` and ``profile``).
        caller: The identity the policy judges (``operator``).

    Use ``async with MemoryClient() as memory:`` or call ``aclose``. Namespaces are given as
    ``"user/ana"`` or ``("user", "ana")``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        profile: str | None = None,
        settings: Settings | None = None,
        caller: str = OPERATOR,
    ) -> None:
        self.settings = settings or operator_settings(state_dir, profile=profile)
        self.caller = caller
        self._memory: PolicedMemory | None = None
        self._store: MemoryStore | None = None
        self._audit: Any = None

    async def _open(self) -> PolicedMemory:
        if self._memory is None:
            policy = (
                Policy.load(self.settings.policy_file)
                if self.settings.policy_file
                else Policy.default()
            )
            self._store = await open_memory_store(self.settings)
            self._audit = await asyncio.to_thread(open_audit_log, self.settings)
            self._memory = PolicedMemory(self._store, policy, self.caller, self._audit)
        return self._memory

    async def __aenter__(self) -> MemoryClient:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the store and the audit log."""
        if self._store is not None:
            await self._store.aclose()
        if self._audit is not None:
            await asyncio.to_thread(self._audit.close)
        self._memory = self._store = self._audit = None

    async def _guarded(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except MemoryInputError as exc:
            raise InputError(str(exc)) from None
        except MemoryDeniedError as exc:
            raise MemoryAccessError(str(exc)) from None
        except EmbeddingError as exc:
            raise StratagemRuntimeError(str(exc)) from None

    async def put(
        self,
        namespace: str | Sequence[str],
        key: str,
        value: JsonValue,
        *,
        ttl_s: float | None = None,
    ) -> MemoryItem:
        """Keep ``value`` under ``(namespace, key)`` (``MemoryStore.put``); audited."""
        memory = await self._open()
        return await self._guarded(self._put(memory, namespace, key, value, ttl_s))

    async def _put(
        self,
        memory: PolicedMemory,
        namespace: str | Sequence[str],
        key: str,
        value: JsonValue,
        ttl_s: float | None,
    ) -> MemoryItem:
        return await memory.put(_namespace(namespace), key, value, ttl_s=ttl_s)

    async def get(self, namespace: str | Sequence[str], key: str) -> MemoryItem | None:
        """The item at ``(namespace, key)``, or ``None``."""
        memory = await self._open()
        return await self._guarded(self._call(memory.get, namespace, key))

    async def delete(self, namespace: str | Sequence[str], key: str) -> bool:
        """Remove ``(namespace, key)``; whether it was there. Audited."""
        memory = await self._open()
        return await self._guarded(self._call(memory.delete, namespace, key))

    async def list(
        self, namespace: str | Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        """The items of ``namespace`` and below, by namespace then key."""
        memory = await self._open()

        async def run() -> Sequence[MemoryItem]:
            return await memory.list(_namespace(namespace), limit=limit, offset=offset)

        return await self._guarded(run())

    async def search(
        self,
        namespace: str | Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        """Recall the items of ``namespace`` (and below) best matching ``query``."""
        memory = await self._open()

        async def run() -> Sequence[MemoryItem]:
            return await memory.search(_namespace(namespace), query, filter=filter, limit=limit)

        return await self._guarded(run())

    @staticmethod
    async def _call(fn: Any, namespace: str | Sequence[str], key: str) -> Any:
        return await fn(_namespace(namespace), key)


class SyncMemoryClient:
    """``MemoryClient`` for code without an event loop: the same methods, blocking.

    Use ``with SyncMemoryClient() as memory:`` or call ``close``.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        profile: str | None = None,
        settings: Settings | None = None,
        caller: str = OPERATOR,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = MemoryClient(state_dir, profile=profile, settings=settings, caller=caller)
        self.settings = self._client.settings

    def _run(self, call: Awaitable[T]) -> T:
        return self._loop.run_until_complete(call)

    def __enter__(self) -> SyncMemoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the store, the audit log and the loop."""
        if not self._loop.is_closed():
            self._run(self._client.aclose())
            self._loop.close()

    def put(
        self,
        namespace: str | Sequence[str],
        key: str,
        value: JsonValue,
        *,
        ttl_s: float | None = None,
    ) -> MemoryItem:
        """``MemoryClient.put``."""
        return self._run(self._client.put(namespace, key, value, ttl_s=ttl_s))

    def get(self, namespace: str | Sequence[str], key: str) -> MemoryItem | None:
        """``MemoryClient.get``."""
        return self._run(self._client.get(namespace, key))

    def delete(self, namespace: str | Sequence[str], key: str) -> bool:
        """``MemoryClient.delete``."""
        return self._run(self._client.delete(namespace, key))

    def list(
        self, namespace: str | Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        """``MemoryClient.list``."""
        return self._run(self._client.list(namespace, limit=limit, offset=offset))

    def search(
        self,
        namespace: str | Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        """``MemoryClient.search``."""
        return self._run(self._client.search(namespace, query, filter=filter, limit=limit))
