"""The state directory is a trust boundary: what is in it decides where the CLI sends the
operator's token, which Ray it joins and which processes ``down`` signals.

The state directory is found by walking up to the nearest ``.stratagem`` folder, or named
(``--state-dir``, ``STRATAGEM_STATE_DIR``, a profile). Whoever can write it can plant an endpoint
file, a Ray address or a process id, so it is used only when this user owns it and neither its
group nor others may write it (``check_state_dir``: one line refusing it otherwise). What the
runtime writes there is created private: folders 0700 (``private_dir``), files 0600
(``write_private``, ``open_private``), and a state directory of this user's made looser by an older
version is narrowed to 0700 when the runtime writes to it. A file the runtime reads to decide
where to connect or what to signal is trusted only when it is a regular file of this user's that
nobody else may read or write (``untrusted``).

Ray-free, and nothing here reads the environment.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

from pydantic_settings import SettingsError

__all__ = [
    "FILE_MODE",
    "FOLDER_MODE",
    "StateDirError",
    "check_state_dir",
    "open_private",
    "private_dir",
    "read_private",
    "untrusted",
    "write_private",
]

FOLDER_MODE: Final = 0o700
"""The mode of the state directory and every folder the runtime makes in it."""
FILE_MODE: Final = 0o600
"""The mode of every file the runtime writes in the state directory."""
_MAX_STATE_FILE_BYTES: Final = 1 << 20


class StateDirError(SettingsError):
    """The state directory (or a file in it) is not this user's alone: refused, in one line."""


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_state_dir(path: Path) -> None:
    """Refuse a state directory this user does not own, or that its group or others may write
    (nothing is checked while it does not exist: the runtime creates it private).

    Raises:
        StateDirError: One line naming the folder, what is wrong and the fix.
    """
    try:
        status = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateDirError(f"cannot use the state directory {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(status.st_mode):
        raise StateDirError(f"the state directory {path} is not a folder")
    if status.st_uid != os.geteuid():
        raise StateDirError(
            f"refusing the state directory {path}: it belongs to {_owner_name(status.st_uid)}, "
            "not to you (a folder someone else made can plant endpoints and Ray addresses); "
            "pass --state-dir or STRATAGEM_STATE_DIR naming a folder of your own"
        )
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o022:
        raise StateDirError(
            f"refusing the state directory {path}: its group or others may write it (mode "
            f"{mode:o}), so anyone could plant endpoints and Ray addresses there; chmod 700 it"
        )


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) with mode 0700; narrow a folder of this user's that is
    looser (made by an older version). Returns ``path``."""
    path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        status = path.stat()
        if status.st_uid == os.geteuid() and stat.S_IMODE(status.st_mode) != FOLDER_MODE:
            path.chmod(FOLDER_MODE)
    return path


def write_private(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` with mode 0600 in one step: a reader sees the old content or
    the new one. The folder is made private first.

    Raises:
        OSError: When it cannot be written.
    """
    private_dir(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    scratch = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        scratch.unlink()
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            scratch.unlink()
        raise


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """Open ``path`` (a log, a span file) with mode 0600 when it is created, narrowed to 0600 when
    an older version made it looser; returns the file descriptor."""
    fd = os.open(path, flags | os.O_NOFOLLOW, FILE_MODE)
    with contextlib.suppress(OSError):
        status = os.fstat(fd)
        if status.st_uid == os.geteuid() and stat.S_IMODE(status.st_mode) & 0o077:
            os.fchmod(fd, FILE_MODE)
    return fd


def _distrust(status: os.stat_result) -> str:
    """Why a file with ``status`` is not trusted (``""`` when it is)."""
    if not stat.S_ISREG(status.st_mode):
        return "it is not a regular file"
    if status.st_uid != os.geteuid():
        return f"it belongs to {_owner_name(status.st_uid)}, not to you"
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        return f"others may read or write it (mode {mode:o}, not 600)"
    return ""


def untrusted(path: Path) -> str:
    """Why the file at ``path`` is not trusted to say where to connect or what to signal
    (``""`` when it is: a regular file of this user's that nobody else may read or write).

    Raises:
        FileNotFoundError: There is no such file.
    """
    return _distrust(path.lstat())


def read_private(path: Path) -> bytes:
    """The content of a trusted file (see ``untrusted``), at most 1 MiB.

    Raises:
        FileNotFoundError: There is no such file.
        StateDirError: The file is not trusted (one line naming it and why).
        OSError: It cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateDirError(f"refusing {path}: it is a symbolic link") from exc
        raise
    try:
        reason = _distrust(os.fstat(fd))
        if reason:
            raise StateDirError(f"refusing {path}: {reason}")
        return os.read(fd, _MAX_STATE_FILE_BYTES)
    finally:
        os.close(fd)
