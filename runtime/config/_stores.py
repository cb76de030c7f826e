"""The store factory: where a deployment keeps its state, chosen by one URL.

Without ``STRATAGEM_STORE_URL`` the state is SQLite files in the state directory (the embedded
default); with one, its scheme picks a backend in ``BACKENDS`` (``postgresql://``: one PostgreSQL
database that every node reaches). A backend opens the five stores of a deployment: each agent's
plans (``planning.StateStore``), answers (``protocol.AnswerStore``) and world
(``agents.WorldStore``), and the deployment's one audit log with its signed heads.

In PostgreSQL each agent keeps its plans, answers and world in a schema of its own
(``stratagem_<role>``) and every agent appends to one audit chain (schema ``stratagem``),
serialised across processes. The audit chain's signed heads (``protocol.AuditSealer``) go to
``STATE_DIR/audit.heads`` beside SQLite, and to a table beside the log in PostgreSQL; they are
signed with ``STATE_DIR/audit.key``, which stays outside the database whichever database it is,
and may be mirrored to ``STRATAGEM_AUDIT_HEADS_COPY`` whatever the backend.

A new backend is its store modules (beside ``planning/_store/_sqlite.py`` and the others, on a
seam of its own in ``protocol/_storage/``), a ``StorageBackend`` here and its scheme in
``BACKENDS``; the settings accept its URL. PostgreSQL classes are imported only when a store URL
names PostgreSQL (the ``postgres`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from stratagem.protocol import (
    AnswerRetention,
    AnswerStore,
    FileHeads,
    HeadsStore,
    MirroredHeads,
    ProtocolUsageError,
    SqliteAnswerStore,
    SqliteAuditLog,
)
from stratagem.runtime.config._settings import Settings

if TYPE_CHECKING:
    from stratagem.agents import WorldStore
    from stratagem.planning import StateStore
    from stratagem.protocol import PostgresAuditLog

__all__ = [
    "BACKENDS",
    "StorageBackend",
    "backend_for",
    "open_answer_store",
    "open_audit_heads",
    "open_audit_log",
    "open_state_store",
    "open_world_store",
    "store_location",
]


class StorageBackend(Protocol):
    """One database's way of opening a deployment's stores."""

    def location(self) -> str:
        """Where the state is kept, for people: a folder, or the database without its password."""
        ...

    async def state_store(self, role: str) -> StateStore:
        """``role``'s durable plans, started."""
        ...

    async def answer_store(self, role: str, retention: AnswerRetention) -> AnswerStore:
        """``role``'s answers to cross-agent requests, started."""
        ...

    def world_store(self, role: str) -> WorldStore:
        """Where ``role``'s agent keeps its world model."""
        ...

    def audit_log(self) -> SqliteAuditLog | PostgresAuditLog:
        """The deployment's audit log (one hash chain for every agent)."""
        ...

    def audit_heads(self) -> HeadsStore:
        """Where the audit chain's signed heads are kept, beside the log."""
        ...


def _schema(role: str) -> str:
    return f"stratagem_{role}"


class SqliteBackend:
    """SQLite files (and the world's JSON file) in the state directory: the embedded default."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def location(self) -> str:
        return str(self._settings.state_dir)

    async def state_store(self, role: str) -> StateStore:
        from stratagem.planning import SqliteStateStore  # the engine's store: where agents run

        store = SqliteStateStore(self._settings.plans_path(role))
        await store.start()
        return store

    async def answer_store(self, role: str, retention: AnswerRetention) -> AnswerStore:
        return SqliteAnswerStore(self._settings.answers_path(role), retention)

    def world_store(self, role: str) -> WorldStore:
        from stratagem.agents import FileWorldStore

        return FileWorldStore(self._settings.world_path(role))

    def audit_log(self) -> SqliteAuditLog:
        return SqliteAuditLog(self._settings.audit_path, synchronous=self._settings.audit_sync)

    def audit_heads(self) -> HeadsStore:
        return FileHeads(self._settings.audit_heads_path, fsync=self._settings.audit_sync == "full")


class PostgresBackend:
    """One PostgreSQL database: a schema per agent role, one schema for the audit chain."""

    def __init__(self, settings: Settings) -> None:
        assert settings.store_url is not None
        self._url = settings.store_url

    def location(self) -> str:
        head, _, tail = self._url.partition("@")
        return f"postgresql://…@{tail}" if tail else head

    async def state_store(self, role: str) -> StateStore:
        from stratagem.planning import PostgresStateStore

        return await PostgresStateStore.open(self._url, schema=_schema(role))

    async def answer_store(self, role: str, retention: AnswerRetention) -> AnswerStore:
        from stratagem.protocol import PostgresAnswerStore

        return await PostgresAnswerStore.open(self._url, retention, schema=_schema(role))

    def world_store(self, role: str) -> WorldStore:
        # A row in the agent's schema, which every node reads: an agent restarted on another
        # node keeps its world.
        from stratagem.agents import PostgresWorldStore

        return PostgresWorldStore(self._url, schema=_schema(role))

    def audit_log(self) -> PostgresAuditLog:
        from stratagem.protocol import PostgresAuditLog

        return PostgresAuditLog(self._url)

    def audit_heads(self) -> HeadsStore:
        # A table beside the log, which every node reads: audit verify on any node checks every
        # seal.
        from stratagem.protocol import PostgresAuditHeads

        return PostgresAuditHeads(self._url)


BACKENDS: Final[Mapping[str, Callable[[Settings], StorageBackend]]] = {
    "postgresql": PostgresBackend,
    "postgres": PostgresBackend,
}
"""The backend of each store URL scheme; no URL is ``SqliteBackend``."""


def backend_for(settings: Settings) -> StorageBackend:
    """The backend ``settings.store_url`` names (SQLite files when it is unset).

    Raises:
        ProtocolUsageError: When no backend serves the URL's scheme.
    """
    if settings.store_url is None:
        return SqliteBackend(settings)
    scheme = settings.store_url.partition("://")[0].lower()
    backend = BACKENDS.get(scheme)
    if backend is None:
        raise ProtocolUsageError(
            f"no store backend for {scheme}:// URLs; known: {', '.join(sorted(BACKENDS))}"
        )
    return backend(settings)


def store_location(settings: Settings) -> str:
    """Where state is kept, for people: a folder, or the database without its password."""
    return backend_for(settings).location()


async def open_state_store(settings: Settings, role: str) -> StateStore:
    """``role``'s durable plans, started."""
    return await backend_for(settings).state_store(role)


async def open_answer_store(settings: Settings, role: str) -> AnswerStore:
    """``role``'s answers to cross-agent requests by (caller, request id), started."""
    retention = AnswerRetention(
        max_entries=settings.answer_retention_count, max_age_s=settings.answer_retention_s
    )
    return await backend_for(settings).answer_store(role, retention)


def open_world_store(settings: Settings, role: str) -> WorldStore:
    """Where ``role``'s agent keeps its world model: ``STATE_DIR/<role>.world.json``, or a row in
    the agent's PostgreSQL schema, which every node reads (an agent restarted on another node
    keeps its world)."""
    return backend_for(settings).world_store(role)


def open_audit_log(settings: Settings) -> SqliteAuditLog | PostgresAuditLog:
    """The deployment's audit log (one hash chain for every agent)."""
    return backend_for(settings).audit_log()


def open_audit_heads(settings: Settings) -> HeadsStore:
    """Where the audit chain's signed heads are kept: ``STATE_DIR/audit.heads`` beside a SQLite
    log; a table beside the log in PostgreSQL, which every node reads (so ``audit verify`` on any
    node checks every seal); copied to ``STRATAGEM_AUDIT_HEADS_COPY`` when it is set."""
    heads = backend_for(settings).audit_heads()
    if settings.audit_heads_copy is None:
        return heads
    copy = FileHeads(settings.audit_heads_copy, fsync=settings.audit_sync == "full")
    return MirroredHeads(heads, copy)
