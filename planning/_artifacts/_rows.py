"""The one row format of an artifact record, whichever database holds it."""

from __future__ import annotations

import json
from typing import Any, Final

from stratagem.planning._artifacts._types import ArtifactProvenance, ArtifactRecord

__all__ = ["COLUMNS", "record_of", "row_of"]

COLUMNS: Final = "scope, scope_id, name, version, media_type, size, digest, created_at, provenance"


def row_of(record: ArtifactRecord) -> tuple[Any, ...]:
    """``record`` as the columns ``COLUMNS`` names, in order."""
    return (
        record.scope,
        record.scope_id,
        record.name,
        record.version,
        record.media_type,
        record.size,
        record.digest,
        record.created_at,
        json.dumps(record.provenance.to_json(), separators=(",", ":"), sort_keys=True),
    )


def record_of(row: tuple[Any, ...]) -> ArtifactRecord:
    """The record of a row ``row_of`` made."""
    return ArtifactRecord(
        scope=row[0],
        scope_id=row[1],
        name=row[2],
        version=int(row[3]),
        media_type=row[4],
        size=int(row[5]),
        digest=row[6],
        created_at=float(row[7]),
        provenance=ArtifactProvenance.from_json(json.loads(row[8])),
    )
