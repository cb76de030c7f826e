"""The base every store stands on, whatever it stores (plans, answers, the audit log, the world).

Stores are grouped by what they store, each a protocol (an interface and an in-memory
implementation) plus one module per database, and those modules are thin: this package holds what
they share.

- ``_errors``: the ``StorageError`` family every store raises (``protocol`` re-exports it), and
  ``StorageErrors``, the classes one store raises (``planning``'s state stores raise its own
  subclasses).
- ``_migrations``: the one migration runner, versioned per component, for every dialect.
- ``_sqlite``: SQLite files: connections (WAL), transactions, the version table, error
  translation.
- ``_postgres``: PostgreSQL schemas: pools and connections, the version table, error translation
  (imported only by the PostgreSQL modules: the ``postgres`` extra).
- ``_worker``: ``StoreWorker``, the one thread a store owns for what must not block its loop.

Where a new database goes: a module here for its connections, version table and error
classification (as ``_sqlite``/``_postgres``), one module per store beside the existing ones
(``planning/_store/``, ``protocol/_answers/``, ``protocol/_audit/``, ``agents/_world/``), and its
branch in the factory (``runtime/config/_stores.py``) and settings.
"""

from stratagem.protocol._storage._errors import (
    PROTOCOL_ERRORS,
    StorageCorruptError,
    StorageError,
    StorageErrors,
    StorageSchemaError,
    StorageUnavailableError,
)
from stratagem.protocol._storage._migrations import VersionTable, migrate, run_now
from stratagem.protocol._storage._worker import StoreWorker

__all__ = [
    "PROTOCOL_ERRORS",
    "StorageCorruptError",
    "StorageError",
    "StorageErrors",
    "StorageSchemaError",
    "StorageUnavailableError",
    "StoreWorker",
    "VersionTable",
    "migrate",
    "run_now",
]
