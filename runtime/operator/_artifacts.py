"""The deployment's artifacts as an operator sees them: ``ArtifactsClient``, which
``stratagem artifacts``, Python programs and the console read.

It reads the deployment's ``planning.ArtifactStore`` directly (``STATE_DIR/artifacts``, or the
PostgreSQL schema ``STRATAGEM_STORE_URL`` names): no agent needs to be running. The store's errors
are translated here, once: bad input and an unknown artifact are ``InputError`` (exit 2), a
corrupted blob and a failing backend ``ArtifactReadError`` (exit 1); each is one line.

Each method is a coroutine; its ``*_blocking`` twin runs on the caller's thread (scripts without
an event loop).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from stratagem.runtime.config._errors import InputError, StratagemRuntimeError
from stratagem.runtime.config._settings import Settings, load_settings

if TYPE_CHECKING:
    from stratagem.planning import ArtifactLineage, ArtifactRecord, ArtifactStore

__all__ = ["ArtifactReadError", "ArtifactsClient"]

T = TypeVar("T")


class ArtifactReadError(StratagemRuntimeError):
    """An artifact could not be read: its blob is corrupted or missing, or the store failed."""


@contextmanager
def _translated() -> Iterator[None]:
    # planning is imported when an artifact is read, not with the command line's first tier
    from stratagem.planning import (
        ArtifactError,
        ArtifactInputError,
        ArtifactNotFoundError,
        StoreError,
    )

    try:
        yield
    except (ArtifactInputError, ArtifactNotFoundError) as exc:
        raise InputError(f"artifacts: {exc}") from exc
    except (ArtifactError, StoreError) as exc:
        raise ArtifactReadError(f"artifacts: {exc}") from exc


class ArtifactsClient:
    """The deployment's artifacts: list, show, get and provenance.

    Args:
        settings: The deployment's settings (``load_settings()`` when omitted).
        store: The store to read (the deployment's when omitted; tests pass their own).

    Example::

        from stratagem.runtime import ArtifactsClient

        client = ArtifactsClient()
        for record in client.list_blocking(scope="plan", scope_id="report-1"):
            print(record.name, record.version, record.digest)
        record, data = client.get_blocking("report.md", scope="plan", scope_id="report-1")
    """

    def __init__(self, settings: Settings | None = None, *, store: ArtifactStore | None = None):
        self.settings = settings or load_settings()
        self._store = store

    @property
    def store(self) -> ArtifactStore:
        """The store (opened on first use)."""
        if self._store is None:
            from stratagem.runtime.config._artifacts import open_artifact_store

            with _translated():
                self._store = open_artifact_store(self.settings)
        return self._store

    def _blocking(self, read: Callable[[ArtifactStore], T]) -> T:
        with _translated():
            return read(self.store)

    # --- blocking ----------------------------------------------------------------------------

    def list_blocking(
        self,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        all_versions: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        """The artifacts (each name's newest version unless ``all_versions``), by scope, scope
        id, name and version.

        Raises:
            InputError: a malformed scope or name.
        """

        return self._blocking(
            lambda s: s.list_blocking(
                scope=scope, scope_id=scope_id, name=name, latest=not all_versions
            )
        )

    def show_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """One version's record (the newest when ``version`` is ``None``).

        Raises:
            InputError: no such artifact or version, or a malformed name or scope.
        """
        return self._blocking(
            lambda s: s.record_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    def get_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> tuple[ArtifactRecord, bytes]:
        """One version's record and bytes, checked against its digest.

        Raises:
            InputError: no such artifact or version.
            ArtifactReadError: its blob is corrupted or missing (never served), or the store
                failed.
        """
        return self._blocking(
            lambda s: s.load_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    def provenance_blocking(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactLineage:
        """One version's provenance, with the stored artifacts it was made from."""

        return self._blocking(
            lambda s: s.provenance_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    # --- async -------------------------------------------------------------------------------

    async def list(
        self,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        name: str | None = None,
        all_versions: bool = False,
    ) -> builtins.list[ArtifactRecord]:
        """``list_blocking`` on a worker thread."""
        return await asyncio.to_thread(
            lambda: self.list_blocking(
                scope=scope, scope_id=scope_id, name=name, all_versions=all_versions
            )
        )

    async def show(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactRecord:
        """``show_blocking`` on a worker thread."""
        return await asyncio.to_thread(
            lambda: self.show_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    async def get(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> tuple[ArtifactRecord, bytes]:
        """``get_blocking`` on a worker thread."""
        return await asyncio.to_thread(
            lambda: self.get_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    async def provenance(
        self,
        name: str,
        *,
        scope: str = "deployment",
        scope_id: str = "",
        version: int | None = None,
    ) -> ArtifactLineage:
        """``provenance_blocking`` on a worker thread."""
        return await asyncio.to_thread(
            lambda: self.provenance_blocking(name, scope=scope, scope_id=scope_id, version=version)
        )

    def close(self) -> None:
        """Close the store's connections."""
        if self._store is not None:
            self._store.index.close()
