"""Where a deployment keeps its memory, chosen by the store URL like its other stores.

One memory per deployment, shared by every agent and the operator (namespaces and the policy's
``[[memory]]`` rules scope it): ``STATE_DIR/memory.sqlite3`` without ``STRATAGEM_STORE_URL``, the
``stratagem`` schema of the PostgreSQL database with one. With ``STRATAGEM_MEMORY_EMBEDDINGS_URL``
items are embedded there and a search with a query recalls by vector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.agents import MemoryStore, OpenAIEmbedder, SqliteMemoryStore
from stratagem.runtime.config._settings import Settings

if TYPE_CHECKING:
    from stratagem.agents import Embedder

__all__ = ["open_memory_store"]


async def open_memory_store(settings: Settings) -> MemoryStore:
    """The deployment's memory store, started.

    Raises:
        StorageError: The store cannot be opened.
    """
    embedder: Embedder | None = None
    if settings.memory_embeddings_url:
        embedder = OpenAIEmbedder(settings.memory_embeddings_url, settings.memory_embeddings_model)
    store: MemoryStore
    if settings.store_url is None:
        store = SqliteMemoryStore(settings.memory_path, embedder=embedder)
    else:
        from stratagem.agents import PostgresMemoryStore

        store = PostgresMemoryStore(settings.store_url, schema="stratagem", embedder=embedder)
    await store.start()
    return store
