"""Where a deployment keeps its state: SQLite files in the state directory (the embedded default) or
one PostgreSQL database (``STRATAGEM_STORE_URL``) that every node reaches.

In PostgreSQL each agent keeps its plans and answers in a schema of its own (``stratagem_<role>``)
and every agent appends to one audit chain (schema ``stratagem``), serialised across processes.
The audit chain's signed heads (``protocol.AuditSealer``) go to ``STATE_DIR/audit.heads``, signed
with ``STATE_DIR/audit.key``: outside the database, whichever database it is.
"""

from __future__ import annotations

from stratagem.planning import PostgresStateStore, SqliteStateStore, StateStore
from stratagem.protocol import (
    AnswerRetention,
    AnswerStore,
    PostgresAnswerStore,
    PostgresAuditLog,
    SqliteAnswerStore,
    SqliteAuditLog,
)
from stratagem.runtime._settings import Settings

__all__ = ["open_answer_store", "open_audit_log", "open_state_store", "store_location"]


def _schema(role: str) -> str:
    return f"stratagem_{role}"


def store_location(settings: Settings) -> str:
    """Where state is kept, for people: a folder, or the database without its password."""
    if settings.store_url is None:
        return str(settings.state_dir)
    head, _, tail = settings.store_url.partition("@")
    return f"postgresql://…@{tail}" if tail else head


async def open_state_store(settings: Settings, role: str) -> StateStore:
    """``role``'s durable plans, started."""
    if settings.store_url is not None:
        return await PostgresStateStore.open(settings.store_url, schema=_schema(role))
    store = SqliteStateStore(settings.plans_path(role))
    await store.start()
    return store


async def open_answer_store(settings: Settings, role: str) -> AnswerStore:
    """``role``'s answers to cross-agent requests by (caller, request id), started."""
    retention = AnswerRetention(
        max_entries=settings.answer_retention_count, max_age_s=settings.answer_retention_s
    )
    if settings.store_url is not None:
        return await PostgresAnswerStore.open(settings.store_url, retention, schema=_schema(role))
    return SqliteAnswerStore(settings.answers_path(role), retention)


def open_audit_log(settings: Settings) -> SqliteAuditLog | PostgresAuditLog:
    """The deployment's audit log (one hash chain for every agent)."""
    if settings.store_url is not None:
        return PostgresAuditLog(settings.store_url)
    return SqliteAuditLog(settings.audit_path, synchronous=settings.audit_sync)
