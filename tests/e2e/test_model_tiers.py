"""Per-role model tiers on a real deployment (``docs/model-planning.md``, "Model tiers per
role"): each agent is given its tier's model, and ``status`` and ``describe`` say which. No model
is asked anything here (the servers named are never reached), so no model server is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_cli import run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TIERS = {
    "STRATAGEM_PLANNERS": json.dumps({"perception": "model", "orchestrator": "model"}),
    "STRATAGEM_MODEL_URL": "http://127.0.0.1:9/v1",
    "STRATAGEM_MODEL": "mid",
    "STRATAGEM_MODEL_TIERS": json.dumps(
        {"weak": "tiny", "strong": {"model": "big", "url": "http://127.0.0.1:7/v1"}}
    ),
    "STRATAGEM_ROLE_TIERS": json.dumps({"perception": "weak", "orchestrator": "strong"}),
}


def test_status_and_describe_show_each_roles_tier_model(tmp_path: Path) -> None:
    up = run("up", "--json", state_dir=tmp_path, **TIERS)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        status = run("status", "--json", state_dir=tmp_path, **TIERS)
        assert status.returncode == 0, status.stderr[-2000:]
        models = {a["role"]: a["model"] for a in json.loads(status.stdout)["agents"]}
        assert models == {
            "perception": "tiny (weak)",
            "strategic": "",  # plans by its rules: no model, whatever its tier
            "tactical": "",
            "orchestrator": "big (strong) at http://127.0.0.1:7/v1",
        }
        table = run("status", state_dir=tmp_path, **TIERS)
        assert "tiny (weak)" in table.stdout, table.stdout
        describe = run("describe", "orchestrator", "--json", state_dir=tmp_path, **TIERS)
        assert describe.returncode == 0, describe.stderr[-2000:]
        card = json.loads(describe.stdout)
        assert (card["planner"], card["model"]) == (
            "model",
            "big (strong) at http://127.0.0.1:7/v1",
        )
        shown = run("describe", "perception", state_dir=tmp_path, **TIERS)
        assert "model: tiny (weak)" in shown.stdout, shown.stdout
    finally:
        down = run("down", "--json", state_dir=tmp_path)
        assert down.returncode == 0, down.stderr[-2000:]
