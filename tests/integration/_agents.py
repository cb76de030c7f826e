"""Deployments of the four agents for the integration tests: with an extension, killed, checked.

A test module deploys the agents in a namespace and state directory of its own on the session's
Ray (``extension_deployment``), kills an agent's process and waits for Ray's restart
(``kill_and_wait``), and checks the audit chain its agents wrote (``assert_audit_ok``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stratagem.protocol import SqliteAuditLog, verify_chain
from stratagem.runtime import Deployment, LaunchError, load_settings

__all__ = ["assert_audit_ok", "extension_deployment", "file_lines", "kill_and_wait", "pid_endpoint"]

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def extension_deployment(
    state_dir: Path, namespace: str, extension: str, **settings: Any
) -> Iterator[Deployment]:
    """The four agents with ``extension`` loaded, restarted whenever killed; removed at the end."""
    ours = Deployment(
        load_settings(
            state_dir=state_dir,
            namespace=namespace,
            grpc_host="127.0.0.1",
            extensions=[extension],
            extension_paths=[REPO],
            max_restarts=-1,
            default_deadline_s=30.0,
            request_timeout_s=30.0,
            **settings,
        )
    )
    ours.deploy(detached=False)
    try:
        yield ours
    finally:
        ours.teardown()


def pid_endpoint(dep: Deployment, role: str = "tactical") -> tuple[int, str]:
    """The process and gRPC endpoint of ``role``'s agent."""
    [info] = [info for info in dep.status(timeout_s=60) if info.role == role]
    return info.pid, info.endpoint


def kill_and_wait(
    dep: Deployment, pid: int, role: str = "tactical", timeout_s: float = 120.0
) -> str:
    """SIGKILL the agent's process; the restarted agent's endpoint once it serves again."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(LaunchError):
            [info] = [info for info in dep.status(timeout_s=60) if info.role == role]
            if info.pid != pid and info.health == "serving":
                return info.endpoint
        time.sleep(0.05)
    raise AssertionError(f"the killed {role} agent was not restarted within {timeout_s:.0f}s")


def file_lines(path: Path) -> list[str]:
    """The non-empty lines of a file an extension appends to (none when it does not exist)."""
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line]


def assert_audit_ok(dep: Deployment) -> None:
    """The deployment's SQLite audit chain verifies."""
    log = SqliteAuditLog(dep.settings.audit_path)
    try:
        verdict = verify_chain(list(log.records()))
    finally:
        log.close()
    assert verdict.ok, verdict.reason
