"""The project's own model server (``make model-server``: llama-cpp-python's server), named by
``STRATAGEM_MODEL_URL``/``STRATAGEM_MODEL`` rather than found through the state folder: a goal
planned with it succeeds. Before, every goal failed "answered 500 (tried 4 times while planning
tactical)": the server refuses ``response_format`` type ``json_schema``, the form a server named by
URL is asked in first, and only the state folder's ``server.json`` (``kind: llama.cpp``) picked
``json_object``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_cli import EXAMPLES, run

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.timeout(1800)]


def test_a_goal_plans_with_the_embedded_server_named_by_url(
    model_server: dict[str, str], tmp_path: Path
) -> None:
    model = {
        "STRATAGEM_PLANNERS": json.dumps({"tactical": "model"}),
        "STRATAGEM_MODEL_URL": model_server["url"],
        "STRATAGEM_MODEL": model_server["model"],
    }
    # No server.json here: the URL is all the deployment knows of the server.
    assert not (tmp_path / "model-server").exists()
    up = run("up", "--json", state_dir=tmp_path, **model)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        submit = run(
            "submit", str(EXAMPLES / "crown.yaml"), "--json", state_dir=tmp_path, timeout=900
        )
        assert "answered 500" not in submit.stderr + submit.stdout
        assert submit.returncode == 0, submit.stderr[-3000:]
        assert json.loads(submit.stdout)["status"] == "succeeded"
    finally:
        down = run("down", "--json", state_dir=tmp_path)
        assert down.returncode == 0, down.stderr[-2000:]
