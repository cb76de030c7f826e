"""Which model the agents plan with (runtime.host._models): settled before deploying, one-line
refusals, the embedded server found from its state file, the API key kept out of settings and
reprs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from stratagem.agents import (
    OrchestratorAgent,
    OrchestratorModelPlanner,
    TacticalAgent,
    TacticalModelPlanner,
)
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.host._local import LaunchError
from stratagem.runtime.host._models import attach_model_planner, resolve_model


def test_deterministic_settings_are_left_alone(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    assert resolve_model(settings) is settings


def test_a_model_planner_without_a_server_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="needs a model server: set STRATAGEM_MODEL_URL"):
        resolve_model(load_settings(state_dir=tmp_path, planners={"tactical": "model"}))
    with pytest.raises(LaunchError, match=r"set STRATAGEM_MODEL$"):
        resolve_model(load_settings(state_dir=tmp_path, planner="model", model_url="http://h:1/v1"))


def test_the_embedded_server_is_found_from_its_state_file(tmp_path: Path) -> None:
    (tmp_path / "model-server").mkdir()
    (tmp_path / "model-server" / "server.json").write_text(
        json.dumps({"kind": "llama.cpp", "pid": 1, "url": "http://127.0.0.1:8089/v1", "model": "g"})
    )
    settings = resolve_model(load_settings(state_dir=tmp_path, planner="model"))
    assert (settings.model_url, settings.model) == ("http://127.0.0.1:8089/v1", "g")
    assert settings.model_schema_style == "json_object"
    assert settings.model_max_concurrent == 1
    assert settings.effective_step_timeout_s == 600.0


def test_the_api_key_stays_out_of_settings_and_the_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = load_settings(
        state_dir=tmp_path,
        planners={"tactical": "model"},
        model_url="http://127.0.0.1:9/v1",
        model="m",
        model_api_key="sk-very-secret",
    )
    assert "sk-very-secret" not in settings.model_dump_json()
    assert "sk-very-secret" not in repr(settings)
    tactical = TacticalAgent()
    assert attach_model_planner(tactical, settings, api_key="sk-very-secret")
    assert isinstance(tactical.planner, TacticalModelPlanner)
    assert "sk-very-secret" not in repr(tactical.planner.client)
    # Every built-in role has one now; the orchestrator's too, and the key stays out of it.
    orchestrator = OrchestratorAgent()
    settings = settings.model_copy(update={"planner": "model"})
    assert attach_model_planner(orchestrator, settings, api_key="sk-very-secret")
    assert isinstance(orchestrator.planner, OrchestratorModelPlanner)
    assert "sk-very-secret" not in repr(orchestrator.planner.client)
    assert "sk-very-secret" not in caplog.text
