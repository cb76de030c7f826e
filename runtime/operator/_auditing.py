"""Verifying a deployment's audit chain: what ``stratagem audit verify`` checks and the console's
audit page shows (one function for both)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratagem.protocol import (
    AuditRecord,
    ChainVerdict,
    all_records,
    load_or_create_key,
    verify_chain,
    verify_sealed,
)
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._stores import open_audit_heads, open_audit_log

__all__ = ["AuditCheck", "verify_audit"]


@dataclass(frozen=True, slots=True)
class AuditCheck:
    """A verified chain.

    Attributes:
        verdict: Whether it holds, and where it breaks.
        head: The live log's head hash.
        last: Its last records (as many as asked for), oldest first.
    """

    verdict: ChainVerdict
    head: str
    last: list[AuditRecord] = field(default_factory=list)


def verify_audit(settings: Settings, archive: Path | None = None, *, keep: int = 0) -> AuditCheck:
    """Verify the deployment's audit chain, its archived segments first (``archive``, default
    ``STATE_DIR/audit-archive``), and its signed heads when a sealing key exists (blocking).

    Args:
        settings: The deployment's settings.
        archive: The folder of archived segments.
        keep: How many of the last records to return with the verdict.
    """
    log = open_audit_log(settings)
    heads = open_audit_heads(settings)
    last: collections.deque[AuditRecord] = collections.deque(maxlen=keep)

    def kept(records: Iterator[AuditRecord]) -> Iterator[AuditRecord]:
        for record in records:
            if keep:
                last.append(record)
            yield record

    records = kept(all_records(log, archive or settings.audit_archive_dir))
    try:
        if settings.audit_key_path.exists():
            key = load_or_create_key(settings.audit_key_path)
            verdict = verify_sealed(records, heads, key)
        else:
            verdict = verify_chain(records)
            if verdict.ok and heads.read():
                # Seals that cannot be checked vouch for nothing: a rewritten chain with
                # recomputed hashes would pass a chain-only check.
                verdict = dataclasses.replace(
                    verdict,
                    ok=False,
                    reason=(
                        f"signed heads exist in {heads.where} but the key to check them is missing "
                        f"({settings.audit_key_path}): the chain cannot be vouched for; restore "
                        "the key (or STRATAGEM_STATE_DIR's audit.key) and verify again"
                    ),
                )
        copy = settings.audit_heads_copy
        if (
            verdict.ok
            and copy is not None
            and not copy.exists()
            and (verdict.sealed or heads.read())
        ):
            # Every seal is also appended to the copy: a copy gone while heads exist was deleted
            # (or its mount is missing), and heads cut from the primary would then go unnoticed.
            verdict = dataclasses.replace(
                verdict,
                ok=False,
                reason=(
                    f"the audit heads copy {copy} (STRATAGEM_AUDIT_HEADS_COPY) is missing while "
                    "signed heads exist: it was deleted or its volume is not mounted; restore it "
                    "(or unset STRATAGEM_AUDIT_HEADS_COPY) and verify again"
                ),
            )
        return AuditCheck(verdict, log.head(), list(last))
    finally:
        log.close()
