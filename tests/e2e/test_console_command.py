"""``stratagem console`` as a user runs it: the login URL it prints, the cookie that URL gives,
refusals in one line, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

STRATAGEM = str(Path(sys.executable).parent / "stratagem")


def _env(state: Path, **more: str) -> dict[str, str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state), **more)
    env.pop("RAY_ADDRESS", None)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STRATAGEM, "console", "--no-browser", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_non_loopback_host_needs_tls_or_the_flag(tmp_path: Path) -> None:
    done = _run(["--host", "0.0.0.0", "--port", "0"], _env(tmp_path, STRATAGEM_AUTH="none"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "--tls-cert" in done.stderr
    assert "Traceback" not in done.stderr
    half = _run(["--tls-cert", str(tmp_path / "c.pem")], _env(tmp_path, STRATAGEM_AUTH="none"))
    assert half.returncode == 2
    assert "both --tls-cert and --tls-key" in half.stderr


def test_without_the_operators_credentials_it_does_not_start(tmp_path: Path) -> None:
    done = _run(["--port", "0"], _env(tmp_path, STRATAGEM_AUTH="token"))
    assert done.returncode == 2
    assert "secret" in done.stderr
    assert "Traceback" not in done.stderr


def test_it_prints_a_login_url_that_signs_in_once_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [STRATAGEM, "console", "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path, STRATAGEM_AUTH="none"),
    )
    try:
        assert child.stdout is not None
        url = ""
        for _ in range(10):
            line = child.stdout.readline()
            if "/login?token=" in line:
                url = line.strip()
                break
        assert url.startswith("http://127.0.0.1:")
        base = url.split("/login")[0]
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/api/plans").status_code == 401
            signed = client.get(url.removeprefix(base))
            assert signed.status_code == 200
            assert "HttpOnly" in signed.headers["set-cookie"]
            plans = client.get("/api/plans")
            assert plans.status_code in (200, 502)  # no agent runs: named, never a 500
            assert "Traceback" not in plans.text
        with httpx.Client(base_url=base, timeout=30) as other:
            assert other.get(url.removeprefix(base)).status_code == 403
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        assert "the console stopped" in err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("port", ["65536", "-1"])
def test_a_port_out_of_range_is_one_line(tmp_path: Path, port: str) -> None:
    done = _run(["--port", port], _env(tmp_path, STRATAGEM_AUTH="none"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
