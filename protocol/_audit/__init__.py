"""The audit log: the hash-chained records, their stores, signed heads, verification, archives.

``_log`` (records, the chain, redaction, ``AuditLog`` and ``InMemoryAuditLog``), ``_group`` (group
commit), ``_sqlite`` and ``_postgres`` (the durable logs; the PostgreSQL one imported on first
use, through ``protocol``'s lazy exports: the ``postgres`` extra), ``_heads`` (where signed heads
are kept), ``_seal`` (signing them), ``_verify`` (the chain and the heads checked),
``_archive`` (old records moved to segments).
"""

from stratagem.protocol._audit._archive import (
    ArchivableAuditLog,
    ArchivedSegment,
    ArchiveError,
    all_records,
    archive_audit,
    archived_segments,
)
from stratagem.protocol._audit._heads import FileHeads, HeadsStore, MirroredHeads
from stratagem.protocol._audit._log import (
    GENESIS,
    AsyncAuditLog,
    AuditLog,
    AuditRecord,
    HoldingAuditLog,
    InMemoryAuditLog,
    digest,
    redact,
    redact_value,
)
from stratagem.protocol._audit._seal import (
    KEY_BYTES,
    AuditSealer,
    SealableAuditLog,
    SignedHead,
    load_or_create_key,
)
from stratagem.protocol._audit._sqlite import SqliteAuditLog, Synchronous
from stratagem.protocol._audit._verify import ChainVerdict, verify_chain, verify_sealed

__all__ = [
    "GENESIS",
    "KEY_BYTES",
    "ArchivableAuditLog",
    "ArchiveError",
    "ArchivedSegment",
    "AsyncAuditLog",
    "AuditLog",
    "AuditRecord",
    "AuditSealer",
    "ChainVerdict",
    "FileHeads",
    "HeadsStore",
    "HoldingAuditLog",
    "InMemoryAuditLog",
    "MirroredHeads",
    "SealableAuditLog",
    "SignedHead",
    "SqliteAuditLog",
    "Synchronous",
    "all_records",
    "archive_audit",
    "archived_segments",
    "digest",
    "load_or_create_key",
    "redact",
    "redact_value",
    "verify_chain",
    "verify_sealed",
]
