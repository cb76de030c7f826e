"""``stratagem status`` with no deployment: one line on standard error and exit 1, as when an
agent does not serve, and with ``--json`` a JSON object on standard output that says so (scripts
parse it instead of meeting an empty output).

The command runs in a child process of its own, as a user runs it: a test process that has a Ray
of its own initialised (an integration test's deployment, earlier in the same worker) would be
taken for a deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NONE_FOUND = "no Stratagem deployment found: run 'stratagem up' or pass --address"


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("STRATAGEM_ADDRESS", "RAY_ADDRESS", "STRATAGEM_PROFILE")
    }
    env |= {"STRATAGEM_STATE_DIR": str(state), "STRATAGEM_CONFIG": os.devnull, "COLUMNS": "80"}
    code = "from stratagem.runtime._cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "status", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )


def test_status_without_a_deployment_says_so_in_json_and_exits_1(tmp_path: Path) -> None:
    answer = _status(tmp_path, "--json")
    assert answer.returncode == 1, answer.stderr
    assert json.loads(answer.stdout) == {
        "found": False,
        "mode": None,
        "agents": [],
        "problem": NONE_FOUND,
    }
    assert answer.stderr.strip().splitlines() == [f"error: {NONE_FOUND}"]
    plain = _status(tmp_path)
    assert plain.returncode == 1
    assert plain.stdout == ""
    assert NONE_FOUND in plain.stderr
