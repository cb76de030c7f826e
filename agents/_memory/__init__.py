"""Memory: namespaced key-value items with TTL and recall, kept across restarts.

``_model`` (the item, namespaces, limits, input checks and errors), ``_store`` (the
``MemoryStore`` protocol and the in-memory store for tests), ``_sqlite`` (the SQLite store: FTS5
recall, the embedded default), ``_postgres`` (the PostgreSQL store: ``agents`` exports it on
first use, for the ``postgres`` extra), ``_guard`` (a store under the policy, audited),
``_vectors`` (vector recall) and ``_tools`` (the ``memory.*`` tools of plans). See
``docs/artifacts-memory.md``.
"""

from stratagem.agents._memory._guard import PolicedMemory
from stratagem.agents._memory._model import (
    DEFAULT_LIMITS,
    JsonValue,
    MemoryDeniedError,
    MemoryInputError,
    MemoryItem,
    MemoryLimits,
    Namespace,
    format_namespace,
    parse_namespace,
)
from stratagem.agents._memory._sqlite import SqliteMemoryStore
from stratagem.agents._memory._store import InMemoryMemoryStore, MemoryStore
from stratagem.agents._memory._tools import MEMORY_TOOLS, memory_tools
from stratagem.agents._memory._vectors import (
    VECTOR_SCAN_LIMIT,
    Embedder,
    EmbeddingError,
    OpenAIEmbedder,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MEMORY_TOOLS",
    "VECTOR_SCAN_LIMIT",
    "Embedder",
    "EmbeddingError",
    "InMemoryMemoryStore",
    "JsonValue",
    "MemoryDeniedError",
    "MemoryInputError",
    "MemoryItem",
    "MemoryLimits",
    "MemoryStore",
    "Namespace",
    "OpenAIEmbedder",
    "PolicedMemory",
    "SqliteMemoryStore",
    "format_namespace",
    "memory_tools",
    "parse_namespace",
]
