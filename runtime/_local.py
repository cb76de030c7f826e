"""What the command line knows of a local deployment without joining Ray (no Ray import here).

* ``LocalCluster``: the Ray head ``stratagem up`` started, recorded in the state directory;
* published endpoints: each agent writes ``STATE_DIR/endpoints/<role>.json`` (its gRPC endpoint,
  its process id) once it serves, so a command on the same machine reaches it over gRPC without
  becoming a Ray driver. An entry is used only while its process lives; anything else (another
  machine, a restarted agent not yet published, a stale file) falls back to Ray's directory, which
  stays the source of truth.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stratagem.runtime._rayauth import LOOPBACK, create_token, head_environment
from stratagem.runtime._settings import Settings

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

_HEAD_START_TIMEOUT_S = 60.0
ENDPOINTS_DIR = "endpoints"


class LaunchError(Exception):
    """Stratagem could not be started, reached or stopped; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class LocalCluster:
    """A local Ray head started by ``stratagem up``, owned by the process ``pid``."""

    address: str
    pid: int

    @classmethod
    def recorded(cls, path: Path) -> LocalCluster | None:
        """The head recorded in the state directory, alive or not (``None`` when none is)."""
        try:
            raw = json.loads(path.read_text())
            return cls(address=str(raw["address"]), pid=int(raw["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def read(cls, path: Path) -> LocalCluster | None:
        """The recorded head, or ``None`` when there is none or its process is gone."""
        cluster = cls.recorded(path)
        return cluster if cluster is not None and cluster.alive else None

    @classmethod
    def find(cls, path: Path) -> LocalCluster | None:
        """The recorded head when it runs, ``None`` when none is recorded.

        Raises:
            LaunchError: A head is recorded but its process is gone (one line naming the fix).
        """
        cluster = cls.recorded(path)
        if cluster is not None and not cluster.alive:
            raise LaunchError(
                f"the local Ray head 'stratagem up' started (pid {cluster.pid}, {cluster.address})"
                " is gone: run 'stratagem down', then 'stratagem up'"
            )
        return cluster

    @property
    def alive(self) -> bool:
        """Whether the head's process runs."""
        return alive(self.pid)

    def write(self, path: Path) -> None:
        """Record the head in the state directory."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"address": self.address, "pid": self.pid}))

    @classmethod
    def start(cls, settings: Settings) -> LocalCluster:
        """Start a local Ray head in the background, owned by a process we can stop by its PID."""
        ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
        if ray_cli is None:
            raise LaunchError("the 'ray' command is not installed next to this Python")
        port = _free_port()
        log_path = settings.state_dir / "local-ray.log"
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        # The head asks every caller for this token, and binds its ports to loopback only.
        create_token(settings.ray_token_path)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    ray_cli,
                    "start",
                    "--head",
                    f"--port={port}",
                    f"--node-ip-address={LOOPBACK}",
                    f"--ray-client-server-port={_free_port()}",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    "--block",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=head_environment(settings.ray_token_path),
            )
        cluster = cls(address=f"{LOOPBACK}:{port}", pid=proc.pid)
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

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the head (SIGTERM to the process we started; it stops its Ray processes).

        Ray drains a node for up to 30 s before it stops the processes on it, so the timeout is
        longer than that; only then is the process killed.
        """
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def clean_up(self, settings: Settings, timeout_s: float = 10.0) -> list[str]:
        """After the head's process died: stop what is left of its Ray processes and remove the
        files ``up`` recorded; returns what was cleaned.

        The head was started in a session of its own (process group ``pid``), so whatever of it
        survives (Ray's agents outlive a killed ``ray start``) is found by that group.

        Raises:
            LaunchError: When a leftover process or file could not be removed.
        """
        cleaned: list[str] = []
        if _group_alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _group_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            cleaned.append(f"the dead head's leftover Ray processes (group {self.pid})")
        for path in (settings.local_cluster_file, settings.ray_token_path):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise LaunchError(f"cannot remove {path}: {exc.strerror}") from exc
            cleaned.append(str(path))
        return cleaned


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (zombies waiting to be reaped do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its ")".
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie child of ours does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def published_path(state_dir: Path, role: str) -> Path:
    """Where ``role``'s agent publishes its endpoint."""
    return state_dir / ENDPOINTS_DIR / f"{role}.json"


def publish_endpoint(
    state_dir: Path, role: str, endpoint: str, pid: int, logs: Sequence[str] = ()
) -> None:
    """Record ``role``'s endpoint, process and log files (atomically: a reader sees the old or the
    new)."""
    path = published_path(state_dir, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{pid}.tmp")
    record = {"endpoint": endpoint, "pid": pid, "logs": list(logs)}
    scratch.write_text(json.dumps(record), encoding="utf-8")
    os.replace(scratch, path)


@dataclass(frozen=True, slots=True)
class PublishedAgent:
    """What an agent published in the state directory: its endpoint, process and log files."""

    endpoint: str
    pid: int
    logs: tuple[Path, ...]

    @property
    def alive(self) -> bool:
        """Whether its process runs (on this machine)."""
        return alive(self.pid)


def read_published(state_dir: Path, role: str) -> PublishedAgent | None:
    """What ``role``'s agent published here, its process alive or not (``None``: nothing)."""
    try:
        raw = json.loads(published_path(state_dir, role).read_text(encoding="utf-8"))
        return PublishedAgent(
            endpoint=str(raw["endpoint"]),
            pid=int(raw["pid"]),
            logs=tuple(Path(str(p)) for p in raw.get("logs", [])),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


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


def published_endpoint(settings: Settings, role: str) -> str | None:
    """``role``'s endpoint as its agent published it, when this machine's local deployment (the
    head ``stratagem up`` started) runs it in a live process; else ``None`` (ask Ray)."""
    if settings.address is not None or LocalCluster.read(settings.local_cluster_file) is None:
        return None
    try:
        raw = json.loads(published_path(settings.state_dir, role).read_text(encoding="utf-8"))
        endpoint, pid = str(raw["endpoint"]), int(raw["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return endpoint if alive(pid) else None
