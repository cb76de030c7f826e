"""A Ray cluster of a head and two worker nodes on this machine, for the whole test session.

The head offers the resource ``stratagem-head`` and the label ``stratagem/node=head``; workers
``a`` and ``b`` offer ``stratagem-a`` / ``stratagem-b``, both ``stratagem-worker``, and the labels
``stratagem/node=a|b``. The tests drive Stratagem on it through the ``stratagem`` command (as a
user would: ``up --address``, ``status``, ``submit``, ``down``) and talk gRPC to the agents from
this process, which never joins the cluster itself: it keeps its own embedded Ray for the other
test modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stratagem.protocol import OPERATOR, ClusterSecret, Credentials
from stratagem.runtime import credentials_for, load_settings
from tests.cluster._nodes import RayNodes

REPO = Path(__file__).resolve().parents[2]
_STRATAGEM = shutil.which("stratagem", path=str(Path(sys.executable).parent)) or "stratagem"


@pytest.fixture(scope="session")
def ray_nodes() -> Iterator[RayNodes]:
    """Head + workers ``a`` and ``b``; every node process stopped (by PID) at the session's end."""
    # A short folder: Ray keeps Unix sockets below it, whose paths may not exceed 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="sgr-", dir="/tmp"))
    nodes = RayNodes(folder)
    started = False
    try:
        nodes.start_head(dashboard=True)  # for `ray job submit`
        # One at a time: on a busy 2-core machine a raylet may miss Ray's fixed 30 s to register.
        nodes.add_worker("a", resources={"stratagem-a": 1, "stratagem-worker": 1})
        nodes.wait_for_nodes(2)
        nodes.add_worker("b", resources={"stratagem-b": 1, "stratagem-worker": 1})
        nodes.wait_for_nodes(3)
        nodes.wait_for_dashboard()
        started = True
        yield nodes
    finally:
        nodes.stop()
        if started:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"Ray nodes did not start; their logs are in {folder}")


@dataclass
class Stratagem:
    """A Stratagem deployment on the cluster, driven through the ``stratagem`` command."""

    address: str
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self, *args: str, timeout: float = 240, on_ray: bool = True, address: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """Run ``stratagem ARGS`` with this deployment's environment (and ``--address ADDRESS``,
        the head's GCS unless ``address`` names another, for the commands that reach Ray)."""
        where = ["--address", address or self.address] if on_ray else []
        return subprocess.run(
            [_STRATAGEM, *args, *where],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
            env=self.environment(),
        )

    def environment(self) -> dict[str, str]:
        """This process's environment minus its ``STRATAGEM_*`` settings, plus the deployment's."""
        outer = {k: v for k, v in os.environ.items() if not k.startswith("STRATAGEM_")}
        return {**outer, **self.env}

    def json(self, *args: str, timeout: float = 240, expect: int = 0, address: str = "") -> Any:
        """Run a command with ``--json`` and parse its output; it must exit with ``expect``."""
        done = self.run(*args, "--json", timeout=timeout, address=address)
        assert done.returncode == expect, (args, done.returncode, done.stderr[-2000:])
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{args}: not JSON: {done.stdout[-2000:]!r}") from exc

    def credentials(self, identity: str = OPERATOR) -> Credentials | None:
        """What a client of ``identity`` sends to these agents."""
        settings = load_settings(
            state_dir=self.state_dir, secret_file=self.state_dir / "cluster.secret", auth="token"
        )
        if identity == OPERATOR:
            return credentials_for(settings, identity)
        # Speaking as an agent takes the cluster secret, as the agents hold it.
        return credentials_for(settings, identity, ClusterSecret.load(settings.secret_path))


def stratagem_on(ray_nodes: RayNodes, folder: Path, namespace: str, **settings: Any) -> Stratagem:
    """A deployment's environment: its namespace, state directory and ``STRATAGEM_*`` settings."""
    env = {
        "RAY_AUTH_MODE": "disabled",
        # These nodes listen on this machine's address without Ray token authentication.
        "STRATAGEM_ALLOW_UNAUTHENTICATED_RAY": "1",
        "STRATAGEM_NAMESPACE": namespace,
        "STRATAGEM_STATE_DIR": str(folder),
        "STRATAGEM_DEFAULT_DEADLINE_S": "30",
        "STRATAGEM_REQUEST_TIMEOUT_S": "60",
    }
    for name, value in settings.items():
        text = value if isinstance(value, str) else json.dumps(value)
        env[f"STRATAGEM_{name.upper()}"] = text
    return Stratagem(address=ray_nodes.address, state_dir=folder, env=env)
