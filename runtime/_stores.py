"""Where a deployment keeps its state: SQLite files in the state directory (the embedded default) or
one PostgreSQL database (``STRATAGEM_STORE_URL``) that every node reaches.

In PostgreSQL each agent keeps its plans and answers in a schema of its own (``stratagem_<role>``)
and every agent appends to one audit chain (schema ``stratagem``), serialised across processes.
The audit chain's signed heads (``protocol.AuditSealer``) go to ``STATE_DIR/audit.heads`` beside
SQLite, and to a table beside the log in PostgreSQL; they are signed with ``STATE_DIR/audit.key``,
which stays outside the database whichever database it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.protocol import (
    AnswerRetention,
    AnswerStore,
    FileHeads,
    HeadsStore,
    MirroredHeads,
    SqliteAnswerStore,
    SqliteAuditLog,
)
from stratagem.runtime._settings import Settings

if TYPE_CHECKING:
    from stratagem.agents import WorldStore
    from stratagem.planning import StateStore
    from stratagem.protocol import PostgresAuditLog

__all__ = [
    "open_answer_store",
    "open_audit_heads",
    "open_audit_log",
    "open_state_store",
    "open_world_store",
    "store_location",
]


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
    from stratagem.planning import SqliteStateStore  # the engine's store: only where agents run

    if settings.store_url is not None:
        from stratagem.planning import PostgresStateStore  # needs the postgres extra

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
        from stratagem.protocol import PostgresAnswerStore  # needs the postgres extra

        return await PostgresAnswerStore.open(settings.store_url, retention, schema=_schema(role))
    return SqliteAnswerStore(settings.answers_path(role), retention)


def open_world_store(settings: Settings, role: str) -> WorldStore:
    """Where ``role``'s agent keeps its world model: ``STATE_DIR/<role>.world.json``, or a row in
    the agent's PostgreSQL schema, which every node reads (an agent restarted on another node
    keeps its world)."""
    if settings.store_url is not None:
        from stratagem.runtime._world_pg import PostgresWorldStore  # needs the postgres extra

        return PostgresWorldStore(settings.store_url, schema=_schema(role))
    from stratagem.agents import FileWorldStore

    return FileWorldStore(settings.world_path(role))


def open_audit_log(settings: Settings) -> SqliteAuditLog | PostgresAuditLog:
    """The deployment's audit log (one hash chain for every agent)."""
    if settings.store_url is not None:
        from stratagem.protocol import PostgresAuditLog  # needs the postgres extra

        return PostgresAuditLog(settings.store_url)
    return SqliteAuditLog(settings.audit_path, synchronous=settings.audit_sync)


def open_audit_heads(settings: Settings) -> HeadsStore:
    """Where the audit chain's signed heads are kept: ``STATE_DIR/audit.heads`` beside a SQLite
    log; a table beside the log in PostgreSQL, which every node reads (so ``audit verify`` on any
    node checks every seal)."""
    fsync = settings.audit_sync == "full"
    if settings.store_url is not None:
        from stratagem.protocol import PostgresAuditHeads  # needs the postgres extra

        heads: HeadsStore = PostgresAuditHeads(settings.store_url)
    else:
        heads = FileHeads(settings.audit_heads_path, fsync=fsync)
    if settings.audit_heads_copy is None:
        return heads
    return MirroredHeads(heads, FileHeads(settings.audit_heads_copy, fsync=fsync))
