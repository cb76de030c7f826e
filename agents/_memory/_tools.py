"""Memory as tools of a plan: ``memory.put``, ``memory.get`` and ``memory.search``.

An agent gets these tools when the policy's ``[[memory]]`` rules give it some access (``put`` for
write, ``get``/``search`` for read); each call is checked against the namespace it names
(``PolicedMemory``), so a step that names a namespace its agent may not touch fails with the
``policy`` failure class (not retried) and writes nothing, and each write is audited.

Exactly-once under the engine's rules: ``memory.put`` has side effects and is idempotent (writing
the same value again leaves the same item), so a step interrupted by a crash is run again on
resume rather than held at a reconcile gate; ``get`` and ``search`` have none. Each call's output
is the step's output (``plans show``), and its tool span carries ``stratagem.memory.namespace``,
``stratagem.memory.key`` and, for a search, ``stratagem.memory.hits``.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from stratagem.agents._memory._guard import PolicedMemory
from stratagem.agents._memory._model import (
    MemoryDeniedError,
    MemoryInputError,
    MemoryItem,
    format_namespace,
)
from stratagem.agents._memory._vectors import EmbeddingError
from stratagem.agents._tool import Tool
from stratagem.planning import LogicError, PolicyError, ToolContext, TransientError
from stratagem.protocol import StorageError

__all__ = ["MEMORY_TOOLS", "memory_tools"]

MEMORY_TOOLS = ("memory.put", "memory.get", "memory.search")
"""The memory tools' names."""

_Namespace = StrictStr | list[StrictStr]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryPutInput(_Strict):
    """``memory.put``'s input."""

    namespace: _Namespace = Field(description="Where: 'agent/tactical' or ['agent', 'tactical'].")
    key: StrictStr = Field(description="The key within the namespace.")
    value: Any = Field(description="Any JSON value (at most 64 KiB as JSON).")
    ttl_s: float | None = Field(default=None, description="Seconds until it expires.")


class MemoryGetInput(_Strict):
    """``memory.get``'s input."""

    namespace: _Namespace
    key: StrictStr


class MemorySearchInput(_Strict):
    """``memory.search``'s input."""

    namespace: _Namespace
    query: StrictStr | None = Field(default=None, description="Words to recall by.")
    filter: dict[str, Any] | None = Field(default=None, description="Field path: JSON scalar.")
    limit: int = Field(default=10, ge=1, le=1000)


class MemoryItemOutput(_Strict):
    """One item as a memory tool answers it."""

    namespace: str
    key: str
    value: Any
    updated_at: str
    expires_at: str | None = None
    score: float | None = None


class MemoryGetOutput(_Strict):
    """``memory.get``'s output: the item, or ``found`` false."""

    found: bool
    item: MemoryItemOutput | None = None


class MemorySearchOutput(_Strict):
    """``memory.search``'s output, best match first."""

    items: list[MemoryItemOutput]


def _out(item: MemoryItem) -> MemoryItemOutput:
    return MemoryItemOutput(
        namespace=format_namespace(item.namespace),
        key=item.key,
        value=item.value,
        updated_at=item.updated_at.isoformat(),
        expires_at=None if item.expires_at is None else item.expires_at.isoformat(),
        score=item.score,
    )


def _parts(namespace: str | list[str]) -> tuple[str, ...]:
    if isinstance(namespace, str):
        return tuple(namespace.split("/")) if namespace else ()
    return tuple(namespace)


class _Calls:
    """The tools' bodies over one ``PolicedMemory``; store failures become step failures."""

    def __init__(self, memory: PolicedMemory) -> None:
        self.memory = memory

    @staticmethod
    def _failure(exc: Exception) -> Exception:
        if isinstance(exc, MemoryDeniedError):
            return PolicyError(str(exc))
        if isinstance(exc, MemoryInputError):
            return LogicError(str(exc))
        return TransientError(str(exc))  # a store or an embeddings endpoint that failed

    @staticmethod
    def _trace(namespace: tuple[str, ...], key: str | None = None) -> trace.Span:
        span = trace.get_current_span()
        span.set_attribute("stratagem.memory.namespace", format_namespace(namespace))
        if key is not None:
            span.set_attribute("stratagem.memory.key", key)
        return span

    async def put(self, data: MemoryPutInput, ctx: ToolContext) -> MemoryItemOutput:
        namespace = _parts(data.namespace)
        self._trace(namespace, data.key)
        try:
            item = await self.memory.put(namespace, data.key, data.value, ttl_s=data.ttl_s)
        except (MemoryInputError, MemoryDeniedError, StorageError, EmbeddingError) as exc:
            raise self._failure(exc) from None
        return _out(item)

    async def get(self, data: MemoryGetInput, ctx: ToolContext) -> MemoryGetOutput:
        namespace = _parts(data.namespace)
        self._trace(namespace, data.key)
        try:
            item = await self.memory.get(namespace, data.key)
        except (MemoryInputError, MemoryDeniedError, StorageError) as exc:
            raise self._failure(exc) from None
        return MemoryGetOutput(found=item is not None, item=None if item is None else _out(item))

    async def search(self, data: MemorySearchInput, ctx: ToolContext) -> MemorySearchOutput:
        namespace = _parts(data.namespace)
        span = self._trace(namespace)
        try:
            items = await self.memory.search(
                namespace, data.query, filter=data.filter, limit=data.limit
            )
        except (MemoryInputError, MemoryDeniedError, StorageError, EmbeddingError) as exc:
            raise self._failure(exc) from None
        span.set_attribute("stratagem.memory.hits", len(items))
        return MemorySearchOutput(items=[_out(item) for item in items])


def memory_tools(memory: PolicedMemory) -> list[Tool[Any, Any]]:
    """The memory tools ``memory.caller`` may be given: ``memory.put`` when a ``[[memory]]`` rule
    grants it write access somewhere, ``memory.get`` and ``memory.search`` when one grants read.
    """
    calls = _Calls(memory)
    tools: list[Tool[Any, Any]] = []
    if memory.grants_any("write"):
        tools.append(
            Tool(
                name="memory.put",
                description="Keep a JSON value under a namespace and key in memory.",
                input_model=MemoryPutInput,
                output_model=MemoryItemOutput,
                fn=calls.put,
                side_effects=True,
                idempotent=True,
            )
        )
    if memory.grants_any("read"):
        tools.append(
            Tool(
                name="memory.get",
                description="Read the value kept under a namespace and key.",
                input_model=MemoryGetInput,
                output_model=MemoryGetOutput,
                fn=calls.get,
            )
        )
        tools.append(
            Tool(
                name="memory.search",
                description="Recall the items of a namespace (and below) best matching words.",
                input_model=MemorySearchInput,
                output_model=MemorySearchOutput,
                fn=calls.search,
            )
        )
    return tools
