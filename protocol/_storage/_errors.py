"""The exceptions of every store, whichever database keeps its data.

::

    ProtocolError
    └── StorageError                  a store could not read or write its data (.location)
        ├── StorageSchemaError        the data's schema version is newer than this code knows, or
        │                             a migration failed (.found, .known); also a
        │                             ProtocolUsageError, what the protocol's stores raised for it
        ├── StorageUnavailableError   the database cannot be opened or reached, or another writer
        │                             held its lock past the wait
        └── StorageCorruptError       the database is damaged (not a database, corrupt pages)

A store translates a driver's error (``sqlite3.Error``, ``psycopg.Error``) once, where it calls the
driver, into the class of its kind, keeping the driver's error as ``__cause__``. Calling a store
after closing it stays a ``ProtocolUsageError`` (the caller's misuse, not a storage failure).

``planning``'s ``StoreError`` family derives from these classes (its ``StoreError`` is a
``StorageError`` and a ``PlanningError``); a store passes the classes it raises as a
``StorageErrors``, so the state stores raise planning's classes and the others this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stratagem.protocol._errors import ProtocolError, ProtocolUsageError

__all__ = [
    "PROTOCOL_ERRORS",
    "Kind",
    "StorageCorruptError",
    "StorageError",
    "StorageErrors",
    "StorageSchemaError",
    "StorageUnavailableError",
]

Kind = Literal["error", "unavailable", "corrupt"]
"""What kind of failure a driver's error is (``error``: none more precise)."""


class StorageError(ProtocolError):
    """A store could not read or write its data.

    Attributes:
        location: Where the store keeps its data (a file, or a database and schema without its
            password).
    """

    def __init__(self, message: str, *, location: str = "") -> None:
        self.location = location
        super().__init__(message)


class StorageSchemaError(StorageError, ProtocolUsageError):
    """The data's schema version is newer than this code knows, or a migration failed.

    Attributes:
        location: The store's location.
        found: The schema version found (-1 when a migration failed).
        known: The newest schema version this code knows.
    """

    def __init__(self, message: str, *, location: str, found: int, known: int) -> None:
        self.found = found
        self.known = known
        super().__init__(message, location=location)


class StorageUnavailableError(StorageError):
    """The database cannot be opened or reached, or another writer held its lock past the wait."""


class StorageCorruptError(StorageError):
    """The database is damaged: not a database, or pages that cannot be read."""


@dataclass(frozen=True, slots=True)
class StorageErrors:
    """The classes a store raises, one per kind of failure (subclasses of this module's).

    Attributes:
        error: A failure of no more precise kind.
        schema: A schema version this code does not read, or a failed migration.
        unavailable: A database that cannot be opened, reached or locked.
        corrupt: A damaged database.
    """

    error: type[StorageError] = StorageError
    schema: type[StorageSchemaError] = StorageSchemaError
    unavailable: type[StorageError] = StorageUnavailableError
    corrupt: type[StorageError] = StorageCorruptError

    def of(self, kind: Kind, message: str, location: str) -> StorageError:
        """An exception of ``kind``'s class."""
        if kind == "unavailable":
            return self.unavailable(message, location=location)
        if kind == "corrupt":
            return self.corrupt(message, location=location)
        return self.error(message, location=location)


PROTOCOL_ERRORS = StorageErrors()
"""The classes the protocol's stores (answers, audit) and the world stores raise."""
