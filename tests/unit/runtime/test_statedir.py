"""The state directory as a trust boundary: planted folders and files are refused, what the runtime
writes is private, and ``down`` signals only processes proven to be the deployment's."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stratagem.protocol import ClusterSecret, IdentityKey
from stratagem.runtime import LaunchError, LocalCluster, load_settings
from stratagem.runtime._cli import app
from stratagem.runtime.config._restarts import RestartBudget
from stratagem.runtime.config._statedir import (
    StateDirError,
    check_state_dir,
    private_dir,
    read_private,
    write_private,
)
from stratagem.runtime.host._local import (
    HEAD_ID,
    _start_ticks,
    publish_endpoint,
    published_endpoint,
)

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


def _invoke(*args: str, cwd: Path | None = None, **env: str) -> tuple[int, list[str]]:
    """Run a command in this process; its exit code and its non-empty output lines."""
    previous = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(
            app, list(args), env={"STRATAGEM_STATE_DIR": "", "STRATAGEM_STORE_URL": "", **env}
        )
    finally:
        os.chdir(previous)
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this user's that has nothing to do with any deployment."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


# -- the folder ------------------------------------------------------------------------------------


@as_root
def test_a_planted_state_directory_found_above_is_refused_in_one_line(tmp_path: Path) -> None:
    planted = tmp_path / ".stratagem"
    planted.mkdir()
    (planted / "endpoints").mkdir()
    os.chown(planted, NOBODY, NOBODY)
    below = tmp_path / "project" / "src"
    below.mkdir(parents=True)
    code, lines = _invoke("status", cwd=below, STRATAGEM_STATE_DIR=str(planted))
    assert code == 2, lines
    assert len(lines) == 1
    assert f"refusing the state directory {planted}: it belongs to nobody" in lines[0]
    # Found by walking up from a folder below it: the same refusal, before anything is read.
    # The test's own folder is given back after (left under the planted folder, every later test
    # of this process that finds its state directory from where it runs found the planted one).
    here = Path.cwd()
    os.chdir(below)
    try:
        with pytest.raises(StateDirError, match="belongs to nobody, not to you"):
            load_settings()
    finally:
        os.chdir(here)


def test_a_state_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(StateDirError, match=r"group or others may write it \(mode 777\)"):
        check_state_dir(folder)
    code, lines = _invoke("token", "--state-dir", str(folder))
    assert code == 2
    assert lines == [
        f"error: refusing the state directory {folder}: its group or others may "
        "write it (mode 777), so anyone could plant endpoints and Ray addresses "
        "there; chmod 700 it"
    ]
    folder.chmod(0o755)  # readable by others, writable only by its owner: used
    check_state_dir(folder)
    check_state_dir(tmp_path / "not-yet-made")  # made private by whatever makes it


# -- what the runtime writes ---------------------------------------------------------------


def test_what_the_runtime_writes_in_the_state_directory_is_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # made by an older version
    publish_endpoint(state, "perception", "127.0.0.1:5000", os.getpid())
    LocalCluster(address="127.0.0.1:1", pid=os.getpid()).write(state / "local-ray.json")
    RestartBudget(state / "perception.restarts.json", limit=3, window_s=60).restarted()
    write_private(state / "x.json", "{}")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "endpoints").stat().st_mode) == 0o700
    for name in ("endpoints/perception.json", "local-ray.json", "perception.restarts.json"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(private_dir(tmp_path / "a" / "b").stat().st_mode) == 0o700


def test_a_state_file_is_trusted_only_when_it_is_this_users_alone(tmp_path: Path) -> None:
    path = tmp_path / "local-ray.json"
    write_private(path, "{}")
    assert read_private(path) == b"{}"
    path.chmod(0o644)
    with pytest.raises(StateDirError, match=r"others may read or write it \(mode 644"):
        read_private(path)
    path.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(StateDirError, match="symbolic link"):
        read_private(link)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
        with pytest.raises(StateDirError, match="belongs to nobody"):
            read_private(path)


def test_an_endpoint_file_others_may_read_is_not_used(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, address=None)
    LocalCluster(address="127.0.0.1:1", pid=os.getpid()).write(settings.local_cluster_file)
    publish_endpoint(tmp_path, "perception", "127.0.0.1:5000", os.getpid())
    assert published_endpoint(settings, "perception") == "127.0.0.1:5000"
    (tmp_path / "endpoints" / "perception.json").chmod(0o644)
    assert published_endpoint(settings, "perception") is None
    # A planted local-ray.json is refused, in one line naming it.
    settings.local_cluster_file.chmod(0o666)
    with pytest.raises(LaunchError, match=r"refusing .*local-ray\.json: others may read or write"):
        LocalCluster.recorded(settings.local_cluster_file)


# -- processes ---------------------------------------------------------------------------------


def test_down_never_signals_a_process_a_forged_record_names(
    tmp_path: Path, unrelated: subprocess.Popen[bytes]
) -> None:
    # local-ray.json as an attacker (or a stale record whose pid was reused) would write it,
    # naming an unrelated process of this user's, even with its real start time.
    record = {
        "address": "127.0.0.1:6379",
        "pid": unrelated.pid,
        "started": _start_ticks(unrelated.pid),
        "head_id": "f" * 32,
    }
    (tmp_path / "local-ray.json").write_text(json.dumps(record))
    (tmp_path / "local-ray.json").chmod(0o600)
    code, lines = _invoke("down", "--state-dir", str(tmp_path))
    time.sleep(0.5)  # a SIGTERM would have ended it by now
    assert unrelated.poll() is None, "down signalled a process that is not the deployment's"
    assert code == 0, lines
    assert "runs but is not proven the head, so it was not signalled" in " ".join(lines)
    assert not (tmp_path / "local-ray.json").exists()
    # The older record format (no proof at all) is not followed either.
    (tmp_path / "local-ray.json").write_text(
        json.dumps({"address": "127.0.0.1:6379", "pid": unrelated.pid})
    )
    (tmp_path / "local-ray.json").chmod(0o600)
    code, _ = _invoke("down", "--state-dir", str(tmp_path))
    assert code == 0
    time.sleep(0.5)
    assert unrelated.poll() is None


def test_a_recorded_head_is_proven_by_its_start_time_and_the_id_in_its_environment(
    tmp_path: Path,
) -> None:
    head_id = "a" * 32
    env = {**os.environ, HEAD_ID: head_id}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    try:
        # Until the child has exec'd, /proc shows the environment it was forked with (no id).
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        for _ in range(500):
            if b"time.sleep" in cmdline.read_bytes():
                break
            time.sleep(0.01)
        started = _start_ticks(process.pid)
        assert started is not None
        head = LocalCluster("127.0.0.1:1", process.pid, started, head_id)
        assert head.proven
        assert not LocalCluster("127.0.0.1:1", process.pid, started, "b" * 32).proven
        assert not LocalCluster("127.0.0.1:1", process.pid, started + 1, head_id).proven
        assert LocalCluster("127.0.0.1:1", process.pid).unproven().startswith("was recorded")
        head.write(tmp_path / "local-ray.json")
        assert LocalCluster.find(tmp_path / "local-ray.json") == head
        # Nothing of this head listens on the recorded port: nothing joins it.
        with pytest.raises(LaunchError, match=r"nothing of the local Ray head .* listens"):
            head.check_listener()
        assert head.stop(timeout_s=10)  # proven: signalled (and reaped by the check)
        assert not head.alive
        assert not head.proven
        with pytest.raises(LaunchError, match="is gone"):
            LocalCluster.find(tmp_path / "local-ray.json")
    finally:
        process.kill()
        process.wait()


def test_the_operator_key_is_written_private_and_used_instead_of_the_secret(
    tmp_path: Path,
) -> None:
    from stratagem.runtime.config._security import operator_key, save_operator_key

    settings = load_settings(state_dir=tmp_path, auth="token")
    secret = ClusterSecret.load_or_create(settings.secret_path)
    save_operator_key(settings, secret)
    assert stat.S_IMODE(settings.operator_key_path.stat().st_mode) == 0o600
    settings.secret_path.unlink()  # an operator machine holds only operator.key
    key = operator_key(settings)
    assert (key.identity, key.key_id) == ("operator", secret.key_id)
    assert key.reveal() == IdentityKey.derive(secret, "operator").reveal()
    code, lines = _invoke("token", "--identity", "orchestrator", "--state-dir", str(tmp_path))
    assert code == 2
    assert lines == [
        "error: the operator cannot act as 'orchestrator': it is one of the deployment's "
        "agents, which sign with keys the operator does not hold"
    ]
