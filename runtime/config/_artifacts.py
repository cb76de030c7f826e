"""Where a deployment keeps its artifacts: ``open_artifact_store(settings)``.

One store for the deployment, shared by every agent and read by the CLI and the console: the
records in ``STATE_DIR/artifacts/index.sqlite3`` (or, with ``STRATAGEM_STORE_URL`` naming
PostgreSQL, in its ``stratagem_artifacts`` schema), the blobs under ``STATE_DIR/artifacts/blobs``.
"""

from __future__ import annotations

from pathlib import Path

from stratagem.planning import ArtifactIndex, ArtifactStore, FileBlobStore, SqliteArtifactIndex
from stratagem.runtime.config._settings import Settings

__all__ = ["artifacts_dir", "open_artifact_store"]


def artifacts_dir(settings: Settings) -> Path:
    """``STATE_DIR/artifacts``."""
    return Path(settings.state_dir) / "artifacts"


def open_artifact_store(settings: Settings) -> ArtifactStore:
    """The deployment's artifact store (nothing is opened until its first call).

    Raises:
        planning.ArtifactStorageError: the blob folder cannot be created.
    """
    folder = artifacts_dir(settings)
    index: ArtifactIndex
    if settings.store_url is not None and settings.store_url.lower().startswith("postgres"):
        from stratagem.planning import PostgresArtifactIndex

        index = PostgresArtifactIndex(settings.store_url)
    else:
        index = SqliteArtifactIndex(folder / "index.sqlite3")
    return ArtifactStore(FileBlobStore(folder / "blobs"), index)
