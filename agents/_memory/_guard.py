"""``PolicedMemory``: a memory store as one identity sees it, under the policy, audited.

Every call names the namespace it touches; ``Policy.allows_memory`` decides (deny by default,
``[[memory]]`` rules) before the store is asked, so a refused call reads and writes nothing and
raises ``MemoryDeniedError`` (one line naming the caller, the access and the namespace). Each
write that happened (``memory.put``, ``memory.delete``) and each refusal (``memory.denied``) is a
record of the deployment's audit log: the caller as actor, the namespace as target, the key as
capability, the sha256 of the value's JSON as digest, never the value itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from stratagem.agents._memory._model import (
    JsonValue,
    MemoryDeniedError,
    MemoryItem,
    Namespace,
    check_key,
    check_namespace,
    encode_value,
    format_namespace,
)
from stratagem.agents._memory._store import MemoryStore
from stratagem.protocol import AuditLog, Policy
from stratagem.protocol._audit import AsyncAuditLog, digest
from stratagem.protocol._memory_grants import MemoryAccess

__all__ = ["PolicedMemory"]


class PolicedMemory:
    """``store`` as ``caller`` may use it: each call authorized by ``policy``, each write audited.

    Args:
        store: The deployment's memory store (started by its owner).
        policy: Whose ``[[memory]]`` rules decide.
        caller: The identity calling (an agent's role, ``operator`` for the CLI's user).
        audit: The audit log writes and refusals go to (``None``: not audited, for tests).
    """

    def __init__(
        self, store: MemoryStore, policy: Policy, caller: str, audit: AuditLog | None = None
    ) -> None:
        self.store = store
        self.policy = policy
        self.caller = caller
        self.audit = audit

    def may(self, access: MemoryAccess, namespace: Sequence[str]) -> bool:
        """Whether the caller may ``access`` ``namespace`` (its input checked first)."""
        return self.policy.allows_memory(self.caller, check_namespace(namespace), access)

    def grants_any(self, access: MemoryAccess) -> bool:
        """Whether some ``[[memory]]`` rule gives the caller ``access`` to some namespace (an
        agent's memory tools are registered only then)."""
        return any(
            rule.caller in (self.caller, "*") and access in rule.access
            for rule in self.policy.memory_rules
        )

    async def _record(
        self, action: str, namespace: Namespace, key: str, code: str, detail: str, sha: str = ""
    ) -> None:
        if self.audit is None:
            return
        fields = {
            "actor": self.caller,
            "action": action,
            "target": format_namespace(namespace),
            "capability": key,
            "code": code,
            "detail": detail,
            "digest": sha,
        }
        if isinstance(self.audit, AsyncAuditLog):
            await self.audit.append_async(**fields)
        else:
            await asyncio.to_thread(lambda: self.audit.append(**fields))  # type: ignore[union-attr]

    async def _authorize(
        self, access: MemoryAccess, namespace: Sequence[str], key: str
    ) -> Namespace:
        ns = check_namespace(namespace)
        if not self.policy.allows_memory(self.caller, ns, access):
            await self._record(
                "memory.denied", ns, key, "PERMISSION_DENIED", f"{access} refused by the policy"
            )
            raise MemoryDeniedError(self.caller, ns, access)
        return ns

    async def put(
        self, namespace: Sequence[str], key: str, value: JsonValue, *, ttl_s: float | None = None
    ) -> MemoryItem:
        """``MemoryStore.put`` when the policy lets the caller write ``namespace``; audited."""
        key = check_key(key)
        ns = await self._authorize("write", namespace, key)
        item = await self.store.put(ns, key, value, ttl_s=ttl_s)
        sha = digest(encode_value(item.value).encode("utf-8"))
        ttl = "" if ttl_s is None else f" ttl_s={ttl_s:g}"
        await self._record("memory.put", ns, key, "OK", f"put{ttl}", sha)
        return item

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        """``MemoryStore.delete`` when the policy lets the caller write ``namespace``; audited."""
        key = check_key(key)
        ns = await self._authorize("write", namespace, key)
        found = await self.store.delete(ns, key)
        await self._record("memory.delete", ns, key, "OK" if found else "NOT_FOUND", "delete")
        return found

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None:
        """``MemoryStore.get`` when the policy lets the caller read ``namespace``."""
        key = check_key(key)
        ns = await self._authorize("read", namespace, key)
        return await self.store.get(ns, key)

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]:
        """``MemoryStore.list`` when the policy lets the caller read ``namespace``."""
        ns = await self._authorize("read", namespace, "")
        return await self.store.list(ns, limit=limit, offset=offset)

    async def search(
        self,
        namespace: Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]:
        """``MemoryStore.search`` when the policy lets the caller read ``namespace``."""
        ns = await self._authorize("read", namespace, "")
        return await self.store.search(ns, query, filter=filter, limit=limit)
