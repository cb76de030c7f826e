"""``stratagem status`` with no deployment: one line on standard error and exit 1, as when an
agent does not serve, and with ``--json`` a JSON object on standard output that says so (scripts
parse it instead of meeting an empty output)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from stratagem.runtime._cli import app


def test_status_without_a_deployment_says_so_in_json_and_exits_1(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {
        "STRATAGEM_STATE_DIR": str(state),
        "STRATAGEM_ADDRESS": None,
        "RAY_ADDRESS": None,
        "STRATAGEM_PROFILE": None,
        "STRATAGEM_CONFIG": os.devnull,
    }
    runner = CliRunner()
    answer = runner.invoke(app, ["status", "--json"], env=env)
    assert answer.exit_code == 1, answer.output
    assert json.loads(answer.stdout) == {
        "found": False,
        "mode": None,
        "agents": [],
        "problem": "no Stratagem deployment found: run 'stratagem up' or pass --address",
    }
    assert answer.stderr.strip().splitlines() == [
        "error: no Stratagem deployment found: run 'stratagem up' or pass --address"
    ]
    plain = runner.invoke(app, ["status"], env=env)
    assert plain.exit_code == 1
    assert plain.stdout == ""
    assert "no Stratagem deployment found" in plain.stderr
