"""SQLite for every store that keeps a file: connections, transactions, versions, errors.

Every store's file runs in WAL mode (readers never wait for the writer) with ``synchronous=NORMAL``
by default: a commit that returned survives a crash of the process; an operating-system crash or a
power loss may lose the last commits, never corrupt the file. ``synchronous="FULL"`` fsyncs every
commit (the audit log offers it).

Connections are in autocommit mode (``isolation_level=None``): every transaction is an explicit
``BEGIN IMMEDIATE`` (``transaction``), which takes the write lock up front, so what a transaction
reads is still current when it writes, across processes. A connection may be used from any thread
(one at a time: each store serialises its own).

Errors: ``sqlite3.Error`` is translated here (``storage_error``) by its result code: busy or
locked and cannot-open are ``unavailable``; corrupt and not-a-database are ``corrupt``; the rest
plain. ``is_busy`` tells a lock held by another connection (worth retrying where waiting is
allowed) from a real failure.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

from stratagem.protocol._storage._errors import PROTOCOL_ERRORS, Kind, StorageError, StorageErrors
from stratagem.protocol._storage._migrations import migrate, run_now

__all__ = [
    "SqliteVersions",
    "Synchronous",
    "classify",
    "connect",
    "is_busy",
    "migrate_file",
    "storage_error",
    "transaction",
]

Synchronous = Literal["NORMAL", "FULL"]

SqliteMigration = Callable[[sqlite3.Connection], None]
"""A SQLite migration: statements run on the connection, inside the migration's transaction."""

# SQLite's primary result codes (https://sqlite.org/rescode.html).
_BUSY: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_UNAVAILABLE: Final = _BUSY | {14}  # SQLITE_CANTOPEN
_CORRUPT: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_VERSION_TABLE: Final = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF  # an extended code's primary part


def is_busy(exc: BaseException) -> bool:
    """Whether SQLite refused because another connection holds a lock (try again, waiting)."""
    return isinstance(exc, sqlite3.OperationalError) and (
        _code(exc) in _BUSY or "locked" in str(exc)
    )


def classify(exc: BaseException) -> Kind:
    """The kind of failure ``exc`` (a ``sqlite3.Error`` or an ``OSError``) is."""
    if isinstance(exc, OSError) or is_busy(exc) or _code(exc) in _UNAVAILABLE:
        return "unavailable"
    if _code(exc) in _CORRUPT or (
        type(exc) is sqlite3.DatabaseError and "not a database" in str(exc)
    ):
        return "corrupt"
    return "error"


def storage_error(
    action: str, location: str, exc: BaseException, errors: StorageErrors = PROTOCOL_ERRORS
) -> StorageError:
    """``exc`` as the storage error of its kind: "cannot ACTION in LOCATION: EXC"."""
    return errors.of(classify(exc), f"cannot {action} in {location}: {exc}", location)


def _private_file(path: Path) -> None:
    """Create ``path`` with mode 0600 when missing; narrow it and its WAL files to 0600 when they
    are this user's and looser.

    An existing database is never opened here: closing any descriptor of a database file drops
    every POSIX lock this process holds on it, those of its open SQLite connections included.
    """
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            status = os.stat(f"{path}{suffix}")
            if status.st_uid == os.geteuid() and stat.S_IMODE(status.st_mode) & 0o077:
                os.chmod(f"{path}{suffix}", 0o600)


def connect(
    path: str | PathLike[str],
    *,
    timeout_s: float,
    synchronous: Synchronous = "NORMAL",
    checkpoints: bool = True,
    private: bool = True,
    errors: StorageErrors = PROTOCOL_ERRORS,
) -> sqlite3.Connection:
    """Open a store's file in WAL mode (its folder created when missing), in autocommit mode.

    Args:
        path: The database file.
        timeout_s: How long a statement waits for another connection's lock (0: never; it fails
            at once, which ``is_busy`` tells).
        synchronous: ``NORMAL`` or ``FULL`` (an fsync per commit).
        checkpoints: Whether this connection checkpoints the WAL when it grows (``False`` for a
            connection used on an event loop: its store checkpoints on its own thread).
        private: Create the file with mode 0600 first (SQLite gives its -wal and -shm files the
            database's mode), and narrow a file of this user's that an older version left looser
            (the default: every store file in a state directory is its user's alone).
        errors: The classes to raise.

    Raises:
        StorageError: (``errors``) when the file cannot be opened or is not a database.
    """
    path = Path(path)
    location = str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if private:
            _private_file(path)
        conn = sqlite3.connect(
            path, timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
    except (OSError, sqlite3.Error) as exc:
        raise errors.of(classify(exc), f"cannot open {location}: {exc}", location) from exc
    try:
        _wal(conn, patience_s=max(timeout_s, WAL_PATIENCE_S))
        conn.execute(f"PRAGMA synchronous={synchronous}")
        if not checkpoints:
            conn.execute("PRAGMA wal_autocheckpoint=0")
    except sqlite3.Error as exc:
        conn.close()
        raise errors.of(classify(exc), f"cannot open {location}: {exc}", location) from exc
    return conn


WAL_PATIENCE_S: Final = 10.0
"""How long opening a store waits, at least, for another connection's lock to switch the file to
WAL mode (SQLite does not always call the busy handler for it)."""


def _wal(conn: sqlite3.Connection, *, patience_s: float) -> None:
    """Put the file in WAL mode, retried while another connection holds a lock: the agents of a
    deployment start together and open their shared files (the audit log) at once, and one of
    them was refused "database is locked" at start on a loaded machine."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def transaction(conn: sqlite3.Connection) -> _Transaction:
    """``with transaction(conn):`` runs ``BEGIN IMMEDIATE`` (the write lock, up front), then
    ``COMMIT``, or ``ROLLBACK`` when the body (or the commit itself) raised.

    Driver errors pass through untranslated: the caller translates them with its own action.
    """
    return _Transaction(conn)


class _Transaction:
    # A class, not a generator: it runs on every commit of the engine's hot path.
    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            try:
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.rollback()
                raise
        else:
            self._conn.rollback()


class SqliteVersions:
    """The migration runner's ``VersionTable`` of a SQLite file: one component per file, its
    version the one row of ``schema_version(version)``."""

    database_errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    elsewhere = "another state directory"

    def __init__(self, conn: sqlite3.Connection, location: str) -> None:
        self.conn = conn
        self.location = location

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with transaction(self.conn):
            self.conn.execute(_VERSION_TABLE)
            yield

    async def version(self, component: str) -> int:
        return read_version(self.conn)

    async def set_version(self, component: str, version: int) -> None:
        self.conn.execute("DELETE FROM schema_version")
        self.conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

    async def apply(self, migration: SqliteMigration) -> None:
        migration(self.conn)


def read_version(conn: sqlite3.Connection) -> int:
    """The file's schema version (0 when none was recorded)."""
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def migrate_file(
    conn: sqlite3.Connection,
    component: str,
    migrations: Sequence[SqliteMigration],
    *,
    location: str,
    what: str,
    errors: StorageErrors = PROTOCOL_ERRORS,
) -> int:
    """Run the runner (``_migrations.migrate``) on this thread; the version the file has then."""
    table = SqliteVersions(conn, location)
    return run_now(migrate(table, component, migrations, what=what, errors=errors))
