"""A Ray cluster of several nodes on this one machine, started with ``ray start`` as a user would.

Each node is a ``ray start --block`` process of its own session (so it and everything it starts
can be found and stopped by PID), with its own custom resources and labels. Ray gives every node
this machine's address, so "cross-node" traffic goes between separate raylets and processes over
the machine's interface, exactly as between machines, only without a wire between them.

``kill`` ends a worker node abruptly: SIGKILL to its ``ray start`` process, its raylet and every
process below them (the actors Ray placed there), the way a machine that loses power disappears.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Node", "RayNodes", "descendants"]

_BIN = str(Path(sys.executable).parent)
_RAY = shutil.which("ray", path=_BIN) or "ray"
# The GCS declares a silent node dead after period x threshold (defaults: 5 s x 5 at least);
# shorter here so a node failure test does not wait half a minute for the verdict.
_FAST_FAILURE_DETECTION = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Node:
    """One ``ray start`` process and what it offers."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    resources: dict[str, float]
    labels: dict[str, str]
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class RayNodes:
    """A head and worker nodes on this machine; ``address`` is the head's GCS address."""

    folder: Path
    address: str = ""
    client_address: str = ""  # ray://HOST:PORT of the head's Ray client server
    dashboard_url: str = ""
    nodes: dict[str, Node] = field(default_factory=dict)

    def start_head(
        self, *, cpus: int = 1, labels: dict[str, str] | None = None, dashboard: bool = False
    ) -> None:
        """Start the head node (resource ``stratagem-head``); with ``dashboard``, also Ray's
        dashboard and Jobs API on 127.0.0.1 (``dashboard_url``)."""
        log = self.folder / "head.log"
        if dashboard:
            port = _free_port()
            self.dashboard_url = f"http://127.0.0.1:{port}"
            board = [
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={port}",
            ]
        else:
            board = ["--include-dashboard=false"]
        client_port = _free_port()
        node = self._start(
            "head",
            [
                "--head",
                "--port=0",
                f"--ray-client-server-port={client_port}",
                *board,
                f"--temp-dir={self.folder}/ray",
            ],
            cpus=cpus,
            resources={"stratagem-head": 1},
            labels={"stratagem/node": "head", **(labels or {})},
            log=log,
            env=_FAST_FAILURE_DETECTION,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            match = re.search(r"ray start --address='([^']+)'", log.read_text(errors="replace"))
            if match:
                self.address = match.group(1)
                self.client_address = f"ray://{self.address.rpartition(':')[0]}:{client_port}"
                return
            if node.process.poll() is not None:
                raise RuntimeError(f"the Ray head exited at start; see {log}")
            time.sleep(0.25)
        raise RuntimeError(f"the Ray head did not start within 90 s; see {log}")

    def add_worker(
        self, name: str, *, resources: dict[str, float], labels: dict[str, str] | None = None
    ) -> Node:
        """Start a worker node joined to the head; its label ``stratagem/node`` is ``name``."""
        return self._start(
            name,
            [f"--address={self.address}"],
            cpus=1,
            resources=resources,
            labels={"stratagem/node": name, **(labels or {})},
            log=self.folder / f"{name}.log",
            env={},
        )

    def _start(
        self,
        name: str,
        args: list[str],
        *,
        cpus: int,
        resources: dict[str, float],
        labels: dict[str, str],
        log: Path,
        env: dict[str, str],
    ) -> Node:
        # Distinct free ports for what Ray would otherwise give every node the same default port
        # for (several nodes share this machine, and other Rays may run on it).
        ports = [
            f"--{flag}={_free_port()}"
            for flag in (
                "node-manager-port",
                "object-manager-port",
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "runtime-env-agent-port",
                "metrics-export-port",
            )
        ]
        command = [
            _RAY,
            "start",
            *args,
            *ports,
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(resources)}",
            "--labels=" + ",".join(f"{key}={value}" for key, value in labels.items()),
            # Small object stores: the agents move no large objects, and /dev/shm is shared.
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            "--block",
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # Ray jobs run their entrypoint (`stratagem ...`) with the node's PATH: put this
                # Python's scripts first, as on a machine where Stratagem is installed.
                env={
                    **os.environ,
                    "PATH": os.pathsep.join([_BIN, os.environ.get("PATH", "")]),
                    "RAY_AUTH_MODE": "disabled",
                    **env,
                },
            )
        node = Node(name, process, log, resources, labels)
        self.nodes[name] = node
        return node

    def wait_for_dashboard(self, timeout_s: float = 120.0) -> None:
        """Block until the head's dashboard (and its Jobs API) answers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"Ray's dashboard at {self.dashboard_url} did not answer")

    def wait_for_nodes(self, count: int, timeout_s: float = 120.0) -> None:
        """Block until ``ray status`` lists ``count`` live nodes."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            out = subprocess.run(
                [_RAY, "status", f"--address={self.address}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            ).stdout
            active = out.split("Active:", 1)[-1].split("Pending:", 1)[0]
            seen = len(re.findall(r"\bnode_[0-9a-f]+", active))
            if seen >= count:
                return
            time.sleep(1)
        tails = "\n".join(
            f"--- {node.name} ({node.log}):\n{node.log.read_text(errors='replace')[-1500:]}"
            for node in self.nodes.values()
        )
        raise RuntimeError(f"{seen} of {count} Ray nodes came up within {timeout_s:.0f}s\n{tails}")

    def kill(self, name: str) -> list[int]:
        """SIGKILL a node and everything it runs; returns the PIDs killed."""
        node = self.nodes[name]
        pids = [node.pid, *descendants(node.pid)]
        _kill_all(pids)
        node.process.wait(timeout=30)
        node.killed = True
        return pids

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every node still running: SIGTERM (Ray drains up to 30 s), then SIGKILL the rest."""
        running = [node for node in self.nodes.values() if not node.killed]
        trees = {node.name: [node.pid, *descendants(node.pid)] for node in running}
        # Workers first, so the head is still there while they leave.
        for node in sorted(running, key=lambda n: n.name == "head"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(_alive(n.pid) for n in running):
            time.sleep(0.5)
        for node in running:
            _kill_all([pid for pid in trees[node.name] if _alive(pid)])
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=10)
