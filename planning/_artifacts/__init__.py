"""Artifacts: content-addressed blobs with versioned, scoped records and provenance.

The API is ``ArtifactStore`` (``save``, ``load``, ``record``, ``list``, ``provenance``, ``prune``,
``sweep``) over a ``BlobStore`` (``FileBlobStore`` by default, ``InMemoryBlobStore`` for tests)
and an ``ArtifactIndex`` (``SqliteArtifactIndex`` by default, ``InMemoryArtifactIndex``). Records
are ``ArtifactRecord`` with an ``ArtifactProvenance``; a step output that went out by reference
carries an ``ArtifactRef``. docs/artifacts-memory.md describes the guarantees.
"""

from stratagem.planning._artifacts._blobs import (
    BlobStore,
    FileBlobStore,
    InMemoryBlobStore,
    blob_digest,
)
from stratagem.planning._artifacts._checks import ARTIFACT_NAME_PATTERN
from stratagem.planning._artifacts._claim import CLAIM_CHECK_BYTES, ClaimCheck
from stratagem.planning._artifacts._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactInputError,
    ArtifactNotFoundError,
    ArtifactStorageError,
    ArtifactTooLargeError,
)
from stratagem.planning._artifacts._index import ArtifactIndex, InMemoryArtifactIndex
from stratagem.planning._artifacts._s3 import S3BlobStore
from stratagem.planning._artifacts._sqlite import SqliteArtifactIndex
from stratagem.planning._artifacts._store import (
    ARTIFACT_INDEX_BYTES_MAX,
    ARTIFACT_MAX_BYTES,
    ArtifactLineage,
    ArtifactsConfig,
    ArtifactStore,
    ArtifactSweep,
)
from stratagem.planning._artifacts._types import (
    ARTIFACT_REF_KEY,
    ARTIFACT_SCOPES,
    ArtifactProvenance,
    ArtifactRecord,
    ArtifactRef,
    ArtifactRetention,
    ArtifactScope,
)

__all__ = [
    "ARTIFACT_INDEX_BYTES_MAX",
    "ARTIFACT_MAX_BYTES",
    "ARTIFACT_NAME_PATTERN",
    "ARTIFACT_REF_KEY",
    "ARTIFACT_SCOPES",
    "CLAIM_CHECK_BYTES",
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactIndex",
    "ArtifactInputError",
    "ArtifactLineage",
    "ArtifactNotFoundError",
    "ArtifactProvenance",
    "ArtifactRecord",
    "ArtifactRef",
    "ArtifactRetention",
    "ArtifactScope",
    "ArtifactStorageError",
    "ArtifactStore",
    "ArtifactSweep",
    "ArtifactTooLargeError",
    "ArtifactsConfig",
    "BlobStore",
    "ClaimCheck",
    "FileBlobStore",
    "InMemoryArtifactIndex",
    "InMemoryBlobStore",
    "S3BlobStore",
    "SqliteArtifactIndex",
    "blob_digest",
]
