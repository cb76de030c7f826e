"""What the command line knows of a local deployment without joining Ray (no Ray import here).

* ``LocalCluster``: the Ray head ``stratagem up`` started, recorded in the state directory
  (``local-ray.json``, mode 0600) with what proves its processes: the head's start time and an id
  in the environment of every process it starts. A record that is not this user's alone is
  refused; ``down`` signals only processes proven this head's, and nothing joins the recorded
  address before a process of this head is proven to listen there (``check_listener``);
* published endpoints: each agent writes ``STATE_DIR/endpoints/<role>.json`` (its gRPC endpoint,
  its process id; mode 0600) once it serves, so a command on the same machine reaches it over gRPC
  without becoming a Ray driver. An entry is used only when it is this user's alone and while its
  process lives, and the agent must prove it holds the deployment's key before a token is sent
  there (``protocol.prove_endpoint``); anything else (another machine, a restarted agent not yet
  published, a stale file) falls back to Ray's directory, which stays the source of truth.

Proving a process needs Linux's ``/proc``; elsewhere the record's pid is taken at its word.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stratagem.runtime.config._errors import LaunchError
from stratagem.runtime.config._published import (
    PublishedAgent,
    alive,
    publish_endpoint,
    published_endpoint,
    published_path,
    read_published,
    recorded_head,
)
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.config._statedir import (
    open_private,
    private_dir,
    write_private,
)
from stratagem.runtime.host._rayauth import LOOPBACK, create_token, head_environment

__all__ = [
    "LaunchError",
    "LocalCluster",
    "PublishedAgent",
    "alive",
    "own_log_files",
    "publish_endpoint",
    "published_endpoint",
    "published_path",
    "read_published",
]

logger = logging.getLogger(__name__)

_HEAD_START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class LocalCluster:
    """A local Ray head started by ``stratagem up``, owned by the process ``pid``.

    ``started`` (the process's start time, in clock ticks since boot) and ``head_id`` (a random
    id put in the environment of the head, which every Ray process it starts inherits) let this
    machine prove that a process is this deployment's before anything signals it or joins the
    address: a recorded pid that was reused, or a planted record, proves nothing (see
    ``proven``). Records from before these fields prove nothing either.
    """

    address: str
    pid: int
    started: int = 0
    head_id: str = ""

    @classmethod
    def recorded(cls, path: Path) -> LocalCluster | None:
        """The head recorded in the state directory, alive or not (``None`` when none is).

        Raises:
            LaunchError: The record is not a file of this user's that nobody else may read or
                write (a planted record is never followed).
        """
        fields = recorded_head(path)
        return None if fields is None else cls(*fields)

    @classmethod
    def read(cls, path: Path) -> LocalCluster | None:
        """The recorded head, or ``None`` when there is none or its process is gone."""
        cluster = cls.recorded(path)
        return cluster if cluster is not None and cluster.alive else None

    @classmethod
    def find(cls, path: Path) -> LocalCluster | None:
        """The recorded head when it runs and is proven this deployment's, ``None`` when none is
        recorded.

        Raises:
            LaunchError: A head is recorded but its process is gone, or is not provably the head
                ``up`` started (one line naming the fix).
        """
        cluster = cls.recorded(path)
        if cluster is None:
            return None
        why = cluster.unproven()
        if why:
            raise LaunchError(
                f"the local Ray head 'stratagem up' started (pid {cluster.pid}, "
                f"{cluster.address}, recorded in {path}) {why}: run 'stratagem down', then "
                "'stratagem up'"
            )
        return cluster

    @property
    def alive(self) -> bool:
        """Whether the recorded process runs (whichever process it is: see ``proven``)."""
        return alive(self.pid)

    @property
    def proven(self) -> bool:
        """Whether the recorded process runs and is the head ``up`` started (see ``unproven``)."""
        return not self.unproven()

    def unproven(self) -> str:
        """Why the recorded process cannot be taken for the head ``up`` started (``""`` when it
        can): it is gone, it started at another time, or it does not carry the head's id."""
        if not self.alive:
            return "is gone"
        if not _PROC.is_dir():
            return ""  # no way to tell here: the record's word, as on every platform before
        if not self.head_id or not self.started:
            return "was recorded without the proof of its process (an older record)"
        if _start_ticks(self.pid) != self.started or _environ_value(self.pid, HEAD_ID) != (
            self.head_id
        ):
            return f"is gone (pid {self.pid} is now another process)"
        return ""

    def check_listener(self) -> None:
        """Prove that what listens on the recorded address is a process of this head, before
        anything joins it (a planted or stale address never gets this user's Ray token).

        Raises:
            LaunchError: Nothing of this head listens there.
        """
        why = self.unproven()
        if why:
            raise LaunchError(f"the local Ray head (pid {self.pid}) {why}")
        if not _PROC.is_dir():
            return
        port = int(self.address.rpartition(":")[2])
        listeners = _listening_inodes(port)
        ours = {inode for pid in _members(self.head_id) for inode in _socket_inodes(pid)}
        if not listeners & ours:
            raise LaunchError(
                f"nothing of the local Ray head (pid {self.pid}) listens on {self.address}: "
                "refusing to join it; run 'stratagem down', then 'stratagem up'"
            )

    def write(self, path: Path) -> None:
        """Record the head in the state directory (mode 0600)."""
        record = {
            "address": self.address,
            "pid": self.pid,
            "started": self.started,
            "head_id": self.head_id,
        }
        write_private(path, json.dumps(record))

    @classmethod
    def start(cls, settings: Settings) -> LocalCluster:
        """Start a local Ray head in the background, owned by a process we can stop by its PID."""
        ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if ray_cli is None:
            raise LaunchError("the 'ray' command is not installed next to this Python")
        port = _free_port()
        log_path = settings.state_dir / "local-ray.log"
        private_dir(settings.state_dir)
        # The head asks every caller for this token, and binds its ports to loopback only.
        create_token(settings.ray_token_path)
        head_id = secrets.token_hex(16)
        env = head_environment(settings.ray_token_path)
        env[HEAD_ID] = head_id
        log = os.fdopen(open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")
        with log:
            proc = subprocess.Popen(
                [
                    ray_cli,
                    "start",
                    "--head",
                    f"--port={port}",
                    f"--node-ip-address={LOOPBACK}",
                    f"--ray-client-server-port={_free_port()}",
                    # Ray's default (52365) is one fixed port per machine: a second head, or any
                    # other Ray on the machine, would collide with this one on it.
                    f"--dashboard-agent-listen-port={_free_port()}",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    "--block",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        cluster = cls(
            address=f"{LOOPBACK}:{port}",
            pid=proc.pid,
            started=_start_ticks(proc.pid) or 0,
            head_id=head_id,
        )
        deadline = time.monotonic() + _HEAD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LaunchError(f"the local Ray head exited at start; see {log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                cluster.write(settings.local_cluster_file)
                return cluster
            time.sleep(0.25)
        cluster.stop()
        raise LaunchError(f"the local Ray head did not start within {_HEAD_START_TIMEOUT_S:.0f}s")

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Stop the head (SIGTERM to the process we started; it stops its Ray processes), when it
        is proven this deployment's (see ``unproven``); returns whether it was signalled.

        Ray drains a node for up to 30 s before it stops the processes on it, so the timeout is
        longer than that; only then is the process killed.
        """
        if not self.proven:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(self.pid) and self.proven:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return True

    def clean_up(self, settings: Settings, timeout_s: float = 10.0) -> list[str]:
        """After the head's process died: stop what is left of its Ray processes and remove the
        files ``up`` recorded; returns what was cleaned.

        Only processes that carry the head's id in their environment are signalled (Ray's agents
        outlive a killed ``ray start``, and inherit its environment), with the rest of the head's
        session once one of them proves it the head's (``_head_session``: Ray's workers overwrite
        their environment); a record without that id, or a pid now used by another process,
        signals nothing.

        Raises:
            LaunchError: When a leftover process or file could not be removed.
        """
        cleaned: list[str] = []
        session = _head_session(self.pid, self.head_id)
        leftovers = _members(self.head_id, session)
        if leftovers:
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(alive(pid) for pid in leftovers):
                time.sleep(0.2)
            # SIGKILL what is left (a process started meanwhile too), and wait until each has
            # exited: a killed process holds its sockets until it does, and a loaded machine
            # takes a while to get there.
            deadline = time.monotonic() + timeout_s
            while (left := _members(self.head_id, session)) and time.monotonic() < deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
            if left:
                raise LaunchError(
                    f"the dead head's leftover Ray processes {', '.join(map(str, left))} did not"
                    f" stop within {2 * timeout_s:g} s of SIGTERM and SIGKILL"
                )
            cleaned.append(f"the dead head's {len(leftovers)} leftover Ray processes")
        for path in (settings.local_cluster_file, settings.ray_token_path):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise LaunchError(f"cannot remove {path}: {exc.strerror}") from exc
            cleaned.append(str(path))
        return cleaned


_PROC: Final = Path("/proc")
HEAD_ID: Final = "STRATAGEM_RAY_HEAD_ID"
"""The environment variable that marks every process of the local head ``up`` started."""


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), ``None`` when unknown."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in process ``pid``'s initial environment (``None``: unset or not
    readable, as another user's process is)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def _processes() -> Iterator[tuple[int, int]]:
    """The pid and session id of each live process of this user's (zombies and this one aside)."""
    if not _PROC.is_dir():
        return
    uid = os.geteuid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            state, session = fields[0], int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        pid = int(entry.name)
        if state != "Z" and pid != os.getpid():
            yield pid, session


def _members(head_id: str, session: int | None = None) -> list[int]:
    """The live processes of this user's whose environment carries ``head_id`` and, given
    ``session``, every one of that session (zombies aside)."""
    if not head_id:
        return []
    return [
        pid
        for pid, sid in _processes()
        if sid == session or _environ_value(pid, HEAD_ID) == head_id
    ]


def _head_session(pid: int, head_id: str) -> int | None:
    """The dead head's session, when its leftovers can be told by it; else ``None``.

    ``up`` starts the head as the leader of a session of its own, and Ray's processes stay in
    it. Ray's workers rewrite their command line over their initial environment (the process
    title ``ray::…``), so the head's id is no longer readable there: only their session says
    whose they are. The session counts only when the head's pid is free (the kernel gives no
    new process the id of a session that still has members) and a process of that session proves
    it the head's: it carries the head's id, or holds a file of the Ray session the head started.
    """
    if not head_id or alive(pid):
        return None
    in_session = {p for p, sid in _processes() if sid == pid}
    if any(
        _environ_value(p, HEAD_ID) == head_id or _holds_ray_session_of(p, pid) for p in in_session
    ):
        return pid
    return None


_RAY_SESSION: Final = re.compile(r"/session_[^/]*_(\d+)/")
"""A file in a Ray session's folder, named after its head's pid (``session_<time>_<pid>``)."""


def _holds_ray_session_of(pid: int, head: int) -> bool:
    """Whether process ``pid`` holds open a file of the Ray session the head ``head`` started
    (Ray's dashboard and runtime-env agents keep their logs there, and outlive a killed head with
    their environment written over)."""
    try:
        entries = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in entries:
        with contextlib.suppress(OSError):
            found = _RAY_SESSION.search(os.readlink(fd))
            if found is not None and int(found.group(1)) == head:
                return True
    return False


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes: set[int] = set()
    try:
        entries = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in entries:
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def _listening_inodes(port: int) -> set[int]:
    """The inodes of the TCP sockets listening on ``port`` (IPv4 and IPv6)."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... inode: "0100007F:1F90" ... "0A" (LISTEN)
            if len(fields) > 9 and fields[3] == "0A":
                with contextlib.suppress(ValueError):
                    if int(fields[1].rpartition(":")[2], 16) == port:
                        inodes.add(int(fields[9]))
    return inodes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def own_log_files() -> list[str]:
    """The files this process's standard output and error go to (a Ray worker's ``.out`` and
    ``.err`` logs), where the system says (Linux's ``/proc``); empty elsewhere."""
    found: list[str] = []
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and os.path.isfile(target) and target not in found:
            found.append(target)
    return found
