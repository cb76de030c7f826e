"""The deployment's memory store: a SQLite file of the state directory, kept across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from stratagem.agents import OpenAIEmbedder, SqliteMemoryStore
from stratagem.runtime.config._memory import open_memory_store
from stratagem.runtime.config._settings import load_settings


async def test_memory_lives_in_the_state_directory_across_restarts(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    store = await open_memory_store(settings)
    assert isinstance(store, SqliteMemoryStore)
    assert store.path == tmp_path / "memory.sqlite3"
    assert store.embedder is None
    await store.put(("user", "ana"), "k", {"text": "kept"})
    await store.aclose()
    again = await open_memory_store(load_settings(state_dir=tmp_path))
    try:
        item = await again.get(("user", "ana"), "k")
        assert item is not None
        assert item.value == {"text": "kept"}
    finally:
        await again.aclose()


async def test_an_embeddings_url_turns_vector_recall_on(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        memory_embeddings_url="http://127.0.0.1:9/v1",
        memory_embeddings_model="tiny",
    )
    store = await open_memory_store(settings)
    try:
        assert isinstance(store, SqliteMemoryStore)
        assert isinstance(store.embedder, OpenAIEmbedder)
        assert store.embedder.url == "http://127.0.0.1:9/v1/embeddings"
    finally:
        await store.aclose()


def test_an_embeddings_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="memory_embeddings_url"):
        load_settings(state_dir=tmp_path, memory_embeddings_url="file:///etc/passwd")
