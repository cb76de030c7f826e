"""The store factory: the store URL's scheme picks the backend; no URL is SQLite files."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.agents import FileWorldStore
from stratagem.protocol import FileHeads, MirroredHeads, ProtocolUsageError
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.config._stores import (
    BACKENDS,
    PostgresBackend,
    SqliteBackend,
    backend_for,
    open_audit_heads,
    open_world_store,
    store_location,
)


def test_no_url_is_sqlite_files_in_the_state_dir(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, store_url="")
    assert isinstance(backend_for(settings), SqliteBackend)
    assert store_location(settings) == str(tmp_path.resolve())
    world = open_world_store(settings, "perception")
    assert isinstance(world, FileWorldStore)
    assert world.path == settings.world_path("perception")
    heads = open_audit_heads(settings)
    assert isinstance(heads, FileHeads)
    assert heads.path == settings.audit_heads_path


def test_a_copy_of_the_heads_wraps_whatever_the_backend_keeps(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, store_url="", audit_heads_copy=tmp_path / "c")
    heads = open_audit_heads(settings)
    assert isinstance(heads, MirroredHeads)
    assert isinstance(heads.copy, FileHeads)
    assert heads.copy.path == (tmp_path / "c").resolve()


def test_the_scheme_picks_the_backend_and_the_location_hides_the_password(
    tmp_path: Path,
) -> None:
    url = "postgresql://stratagem:secret@db.example:5432/stratagem"
    settings = load_settings(state_dir=tmp_path, store_url=url)
    backend = backend_for(settings)  # made without connecting
    assert isinstance(backend, PostgresBackend)
    assert store_location(settings) == "postgresql://…@db.example:5432/stratagem"
    assert set(BACKENDS) == {"postgresql", "postgres"}


def test_a_scheme_without_a_backend_is_refused(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, store_url="")
    unknown = settings.model_copy(update={"store_url": "mysql://db/stratagem"})
    with pytest.raises(ProtocolUsageError, match="no store backend for mysql://"):
        backend_for(unknown)
