"""Where a deployment keeps its artifacts: ``open_artifact_store(settings)``.

One store for the deployment, shared by every agent and read by the CLI and the console: the
records in ``STATE_DIR/artifacts/index.sqlite3`` (or, with ``STRATAGEM_STORE_URL`` naming
PostgreSQL, in its ``stratagem_artifacts`` schema), the blobs under ``STATE_DIR/artifacts/blobs``
(or, with ``STRATAGEM_ARTIFACTS_S3_URL``, in that S3-compatible bucket).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from stratagem.planning import (
    ArtifactIndex,
    ArtifactRetention,
    ArtifactsConfig,
    ArtifactStore,
    BlobStore,
    FileBlobStore,
    SqliteArtifactIndex,
)
from stratagem.runtime.config._errors import InputError
from stratagem.runtime.config._settings import Settings

__all__ = ["artifacts_dir", "open_artifact_store", "s3_blobs"]


def artifacts_dir(settings: Settings) -> Path:
    """``STATE_DIR/artifacts``."""
    return Path(settings.state_dir) / "artifacts"


def open_artifact_store(settings: Settings) -> ArtifactStore:
    """The deployment's artifact store (nothing is opened until its first call).

    Raises:
        planning.ArtifactStorageError: the blob folder cannot be created.
    """
    folder = artifacts_dir(settings)
    blobs: BlobStore = (
        FileBlobStore(folder / "blobs")
        if settings.artifacts_s3_url is None
        else s3_blobs(settings.artifacts_s3_url, settings)
    )
    index: ArtifactIndex
    if settings.store_url is not None and settings.store_url.lower().startswith("postgres"):
        from stratagem.planning import PostgresArtifactIndex

        index = PostgresArtifactIndex(settings.store_url)
    else:
        index = SqliteArtifactIndex(folder / "index.sqlite3")
    retention = {
        scope: ArtifactRetention(
            max_age_s=rule.max_age_s, max_versions=rule.max_versions, keep_latest=rule.keep_latest
        )
        for scope, rule in settings.artifacts_retention.items()
    }
    return ArtifactStore(blobs, index, ArtifactsConfig(retention=retention))


def s3_blobs(url: str, settings: Settings) -> BlobStore:
    """The S3 blob store ``url`` (``http(s)://HOST[:PORT]/BUCKET[/PREFIX]``) names, with the
    credentials of ``settings.artifacts_s3_credentials_file``.

    Raises:
        InputError: a URL without a bucket, or credentials that cannot be read (one line).
    """
    from stratagem.planning._artifacts._s3 import S3BlobStore

    parts = urlsplit(url)
    bucket, _, prefix = parts.path.strip("/").partition("/")
    if parts.scheme not in ("http", "https") or not parts.netloc or not bucket:
        raise InputError(
            f"STRATAGEM_ARTIFACTS_S3_URL: {url!r} is not http(s)://HOST[:PORT]/BUCKET[/PREFIX]"
        )
    path = settings.artifacts_s3_credentials_file
    if path is None:
        raise InputError(
            "STRATAGEM_ARTIFACTS_S3_CREDENTIALS_FILE: needed with STRATAGEM_ARTIFACTS_S3_URL"
        )
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise InputError(
            f"STRATAGEM_ARTIFACTS_S3_CREDENTIALS_FILE: cannot read {path}: {exc.strerror or exc}"
        ) from exc
    if len(lines) != 2:
        raise InputError(
            f"STRATAGEM_ARTIFACTS_S3_CREDENTIALS_FILE: {path} must hold two lines, the access "
            "key then the secret key"
        )
    return S3BlobStore(
        f"{parts.scheme}://{parts.netloc}",
        bucket,
        access_key=lines[0],
        secret_key=lines[1],
        region=settings.artifacts_s3_region,
        prefix=f"{prefix.strip('/')}/sha256/" if prefix else "blobs/sha256/",
    )
