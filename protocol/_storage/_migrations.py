"""The one migration runner of every store and dialect.

A store's schema is a **component** (``plans``, ``answers``, ``audit``, ``audit_heads``,
``world``) with an ordered list of migrations: migration ``i`` (from 0) brings the component to
version ``i + 1``. ``migrate`` opens one transaction that holds the component's migration lock,
reads the version the database records for it, refuses a version newer than the list
(``StorageSchemaError``), runs the missing migrations in order, records the new version and
commits: a migration that fails leaves the previous schema (and a ``StorageSchemaError`` naming
the driver's error).

What differs by dialect is a ``VersionTable``: how a transaction takes the lock, where versions
are kept and how a migration is called:

* SQLite (``_sqlite.SqliteVersions``): a file holds one component; its one-row
  ``schema_version(version)`` table is that component's version, and ``BEGIN IMMEDIATE`` is the
  lock (the layout every SQLite store has written since its first version);
* PostgreSQL (``_postgres.PostgresVersions`` and its blocking twin): a schema holds several
  components, one row each in ``schema_versions(component, version)``; a transaction-level advisory
  lock keyed by the schema orders the processes that open stores on it at once.

The runner is a coroutine. A blocking dialect's table never suspends, so ``run_now`` runs the same
coroutine to its end on the calling thread (SQLite files and the blocking PostgreSQL stores).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from stratagem.protocol._storage._errors import StorageErrors

__all__ = ["VersionTable", "migrate", "run_now"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class VersionTable(Protocol):
    """A dialect's side of a migration, on one connection."""

    @property
    def location(self) -> str:
        """Where the data is, for messages (no password)."""
        ...

    @property
    def elsewhere(self) -> str:
        """What to use instead of a store this code cannot read ("another schema")."""
        ...

    @property
    def database_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's errors: one raised by a migration means the migration failed."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """One transaction holding the migration lock; rolled back when its body raises."""
        ...

    async def version(self, component: str) -> int:
        """The version recorded for ``component`` (0: never migrated), inside the transaction."""
        ...

    async def set_version(self, component: str, version: int) -> None:
        """Record ``component``'s version, inside the transaction."""
        ...

    async def apply(self, migration: Any) -> None:
        """Run one migration (a callable of the dialect's shape), inside the transaction."""
        ...


async def migrate(
    table: VersionTable,
    component: str,
    migrations: Sequence[Any],
    *,
    what: str,
    errors: StorageErrors,
) -> int:
    """Bring ``component`` to ``len(migrations)`` in one transaction; the version it has then.

    Args:
        table: The dialect's version table, on an open connection.
        component: The component's name.
        migrations: Its migrations, oldest first.
        what: The store, for messages ("state store", "audit log").
        errors: The classes to raise.

    Raises:
        StorageSchemaError: (``errors.schema``) when the recorded version is newer than the list,
            or a migration failed (nothing of it is kept then).
    """
    known = len(migrations)
    location = table.location
    try:
        async with table.transaction():
            found = await table.version(component)
            if found > known:
                raise errors.schema(
                    f"the {what} {location} has schema version {found}, newer than this code "
                    f"knows ({known}); upgrade Stratagem or use {table.elsewhere}",
                    location=location,
                    found=found,
                    known=known,
                )
            for version in range(found, known):
                await table.apply(migrations[version])
                logger.info("%s %s: migrated to schema version %d", what, location, version + 1)
            if found < known:
                await table.set_version(component, known)
    except table.database_errors as exc:
        raise errors.schema(
            f"cannot migrate the {what} {location}: {exc}",
            location=location,
            found=-1,
            known=known,
        ) from exc
    return known


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end on this thread; it must never suspend (a blocking dialect's
    migration: every await inside it is of a coroutine that returns without waiting).

    Raises:
        RuntimeError: When the coroutine suspended (it is closed then).
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError("a blocking migration suspended: its version table awaited real I/O")
