"""Ray is part of the trust boundary: the local head `stratagem up` starts asks for a token and
listens on loopback only; a dead head is reported, not replaced; an unauthenticated external Ray
is refused unless the operator accepts the risk."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.runtime.host._rayauth import RayAuth, probe_auth

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
RAY = str(Path(sys.executable).parent / "ray")
REPO = Path(__file__).resolve().parents[2]

# A Ray driver that tries to join a cluster, read a file from a task on it, and call an agent.
DRIVER = textwrap.dedent(
    """
    import json, sys, ray
    from ray._private import ray_constants
    ray_constants.ENABLE_RAY_CLUSTER = False  # keep 127.0.0.1 as given
    if sys.argv[3] == "token":
        from stratagem.runtime.host._rayauth import join_local_head
        from pathlib import Path
        join_local_head(Path(sys.argv[4]))
    try:
        ray.init(address=sys.argv[1], log_to_driver=False, namespace="stratagem")
    except Exception as exc:
        print(json.dumps({"joined": False, "error": str(exc)}))
        sys.exit(0)
    @ray.remote(num_cpus=0)
    def read(path):
        with open(path, "rb") as f:
            return len(f.read())
    size = ray.get(read.remote(sys.argv[2]), timeout=60)
    info = ray.get(ray.get_actor("stratagem-perception").info.remote(), timeout=60)
    print(json.dumps({"joined": True, "secret_bytes": size, "agent": info["role"]}))
    """
)


def run(
    *args: str, state_dir: Path, timeout: float = 240, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="160", **env_extra)
    for name in ("RAY_ADDRESS", "STRATAGEM_SECRET_FILE", "STRATAGEM_ALLOW_UNAUTHENTICATED_RAY"):
        env.pop(name, None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd=REPO,
    )


def _network_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _listening(pgid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket listened on by a process of group ``pgid``."""
    inodes: set[str] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:
                continue
            for fd in (stat.parent / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found: list[tuple[str, int]] = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = cols[1].split(":")
            found.append((_address(raw, width), int(port, 16)))
    return found


def _address(raw: str, width: int) -> str:
    data = bytes.fromhex(raw)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, data[::-1])
    words = b"".join(data[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def _loopback(address: str) -> bool:
    return address in ("127.0.0.1", "::1", "::ffff:127.0.0.1") or address.startswith("127.")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _driver(address: str, secret: Path, *extra: str) -> dict[str, object]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, address, str(secret), *extra],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("ray-boundary")
    up = run("up", "--json", state_dir=state_dir)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield state_dir
    finally:
        down = run("down", "--json", state_dir=state_dir)
        assert down.returncode == 0, down.stderr[-2000:]


def _recorded(state_dir: Path) -> dict[str, object]:
    raw: dict[str, object] = json.loads((state_dir / "local-ray.json").read_text())
    return raw


def test_the_ray_token_is_private_to_the_operator(head: Path) -> None:
    token = head / "ray.token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert len(token.read_text().strip()) >= 32


def test_a_driver_without_the_token_cannot_join_and_one_with_it_can(head: Path) -> None:
    address = str(_recorded(head)["address"])
    secret = head / "cluster.secret"
    stranger = _driver(address, secret, "none")
    assert stranger["joined"] is False
    assert "secret_bytes" not in stranger
    assert "InvalidAuthToken" in str(stranger["stderr"])  # refused for the token, not the address
    operator = _driver(address, secret, "token", str(head / "ray.token"))
    assert operator["joined"] is True, operator
    assert operator["agent"] == "perception"
    assert operator["secret_bytes"] == secret.stat().st_size
    assert probe_auth(address) is RayAuth.TOKEN


def test_the_head_listens_on_loopback_only(head: Path) -> None:
    pid = int(str(_recorded(head)["pid"]))
    listening = _listening(pid)
    gcs_port = int(str(_recorded(head)["address"]).rpartition(":")[2])
    assert gcs_port in {port for _, port in listening}
    assert [(a, p) for a, p in listening if not _loopback(a)] == []
    status = json.loads(run("status", "--json", state_dir=head).stdout)
    agent_ports = [int(a["endpoint"].rpartition(":")[2]) for a in status["agents"]]
    ports = sorted({port for _, port in listening} | set(agent_ports))
    assert all(_reachable("127.0.0.1", port) for port in [gcs_port, *agent_ports])
    outside = _network_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to try")
    assert [port for port in ports if _reachable(outside, port)] == []


def test_a_dead_head_is_reported_and_down_cleans_up_after_it(tmp_path: Path) -> None:
    up = run("up", "--json", state_dir=tmp_path)
    assert up.returncode == 0, up.stderr[-2000:]
    pid = int(str(_recorded(tmp_path)["pid"]))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    for command in (("status",), ("submit", "examples/crown.yaml"), ("plans", "show", "p1")):
        result = run(*command, state_dir=tmp_path, timeout=120)
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 1, (command, result.stderr[-2000:])
        assert len(lines) == 1, (command, result.stderr)
        assert "Traceback" not in result.stderr
        assert f"local Ray head 'stratagem up' started (pid {pid}" in lines[0]
        assert "'stratagem down', then 'stratagem up'" in lines[0]

    down = run("down", state_dir=tmp_path)
    assert down.returncode == 0, down.stderr[-2000:]
    assert f"the local Ray head (pid {pid}) was already gone; cleaned up:" in down.stdout
    assert "local-ray.json" in down.stdout
    assert not (tmp_path / "local-ray.json").exists()
    assert not (tmp_path / "ray.token").exists()
    assert _listening(pid) == []
    again = run("down", state_dir=tmp_path)
    assert again.returncode == 0
    assert "nothing to stop" in again.stdout
    up = run("up", "--json", state_dir=tmp_path)
    assert up.returncode == 0, up.stderr[-2000:]
    assert run("down", state_dir=tmp_path).returncode == 0


def test_down_stops_a_live_head_whose_token_is_gone(tmp_path: Path) -> None:
    up = run("up", "--json", state_dir=tmp_path)
    assert up.returncode == 0, up.stderr[-2000:]
    pid = int(str(_recorded(tmp_path)["pid"]))
    (tmp_path / "ray.token").unlink()
    status = run("status", state_dir=tmp_path)
    assert status.returncode == 1
    assert "cannot read the local Ray head's token" in status.stderr
    down = run("down", "--json", state_dir=tmp_path)
    assert down.returncode == 0, down.stderr[-2000:]
    assert json.loads(down.stdout)["stopped_local_ray"] is True
    assert not Path(f"/proc/{pid}").exists()
    assert not (tmp_path / "local-ray.json").exists()


def test_an_unauthenticated_external_ray_is_refused_unless_allowed(tmp_path: Path) -> None:
    outside = _network_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to start an external Ray on")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            f"--port={port}",
            f"--node-ip-address={outside}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--block",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    address = f"{outside}:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _reachable(outside, port):
            assert time.monotonic() < deadline, "the external Ray did not start"
            time.sleep(0.5)
        assert probe_auth(address) is RayAuth.NONE
        refused = run("up", "--address", address, state_dir=tmp_path)
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 1, refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr
        assert len(lines) == 1, refused.stderr
        assert "refusing to deploy" in lines[0]
        assert "asks for no token" in lines[0]
        assert "--allow-unauthenticated-ray" in lines[0]
        allowed = run("up", "--address", address, "--allow-unauthenticated-ray", state_dir=tmp_path)
        assert allowed.returncode == 0, allowed.stderr[-2000:]
        assert "warning:" in allowed.stderr
        assert "anyone who reaches it can run code in the agents" in allowed.stderr
        assert run("down", "--address", address, state_dir=tmp_path).returncode == 0
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
