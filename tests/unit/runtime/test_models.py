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
from stratagem.protocol import ROLES
from stratagem.runtime.config._settings import Settings, load_settings
from stratagem.runtime.host._local import LaunchError
from stratagem.runtime.host._models import (
    attach_model_planner,
    model_client,
    resolve_model,
    role_model,
)


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


def _tiered(tmp_path: Path, **extra: object) -> Settings:
    return load_settings(
        state_dir=tmp_path,
        planner="model",
        model_url="http://127.0.0.1:9/v1",
        model="mid",
        model_tiers={"weak": "small", "strong": {"model": "big", "url": "http://10.0.0.2:8000/v1"}},
        role_tiers={"perception": "weak", "orchestrator": "strong"},
        **extra,
    )


def test_each_role_plans_with_its_tiers_model(tmp_path: Path) -> None:
    settings = _tiered(tmp_path, model_api_key="sk-default-server")
    clients = {
        role: repr(model_client(role, settings, api_key="sk-default-server"))
        for role in ("perception", "tactical", "orchestrator")
    }
    # weak: its own model at the default server, with the default server's key
    assert "url='http://127.0.0.1:9/v1', model='small', api_key=<set>" in clients["perception"]
    # a role not named stays on the default tier: STRATAGEM_MODEL
    assert "url='http://127.0.0.1:9/v1', model='mid', api_key=<set>" in clients["tactical"]
    # strong: its own server, which is never sent the default server's key
    assert "url='http://10.0.0.2:8000/v1', model='big', api_key=<none>" in clients["orchestrator"]
    assert str(role_model(settings, "orchestrator")) == "big (strong) at http://10.0.0.2:8000/v1"
    assert str(role_model(settings, "strategic")) == "mid (default)"


def test_the_planner_a_role_is_given_uses_its_tiers_model(tmp_path: Path) -> None:
    orchestrator = OrchestratorAgent()
    assert attach_model_planner(orchestrator, _tiered(tmp_path))
    assert isinstance(orchestrator.planner, OrchestratorModelPlanner)
    assert "model='big'" in repr(orchestrator.planner.client)
    # what `stratagem describe` (and `status`) show: the agent's card says its model
    assert orchestrator.card().model == "big (strong) at http://10.0.0.2:8000/v1"
    tactical = TacticalAgent()
    assert tactical.card().model == ""  # before a model planner: it plans by its rules
    assert attach_model_planner(tactical, _tiered(tmp_path))
    assert tactical.card().model == "mid (default)"


def test_without_tiers_every_role_is_on_the_default_model(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path, planner="model", model_url="http://127.0.0.1:9/v1", model="m"
    )
    for role in ("perception", "strategic", "tactical", "orchestrator"):
        assert "model='m'" in repr(model_client(role, settings))
        assert role_model(settings, role).tier == "default"


def test_roles_all_on_tiers_with_their_own_server_need_no_default_server(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        planners={"orchestrator": "model"},
        model_tiers={"strong": {"model": "big", "url": "http://10.0.0.2:8000/v1"}},
        role_tiers={"orchestrator": "strong"},
    )
    assert resolve_model(settings) is settings
    # but a model role on a tier of the default server still needs one, as before
    with pytest.raises(LaunchError, match="needs a model server"):
        resolve_model(settings.model_copy(update={"planners": {"tactical": "model"}}))


def test_a_tier_at_its_own_server_gets_the_key_of_its_key_file_only(tmp_path: Path) -> None:
    key = tmp_path / "strong.key"
    key.write_text("sk-strong-only\n")
    strong = {"model": "big", "url": "http://10.0.0.2:8000/v1", "api_key_file": str(key)}
    settings = load_settings(
        state_dir=tmp_path,
        planner="model",
        model_url="http://127.0.0.1:9/v1",
        model="mid",
        model_tiers={"strong": strong},
        role_tiers={"orchestrator": "strong"},
    )
    assert resolve_model(settings) is settings
    client = model_client("orchestrator", settings, api_key="sk-default-server")
    assert "model='big', api_key=<set>" in repr(client)
    assert "sk-strong-only" not in repr(client)
    key.unlink()
    with pytest.raises(LaunchError, match=r"^model_tiers\.strong\.api_key_file: cannot read "):
        resolve_model(settings)


def test_the_tiers_recipe_of_model_planning_md_gives_each_role_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    from tests.docs_blocks import DOCS, blocks

    [block] = [b for b in blocks(DOCS / "model-planning.md") if "STRATAGEM_ROLE_TIERS" in b.text]
    assert block.run_by == "tests/unit/runtime/test_models.py"
    lines = block.text.splitlines()
    assert lines[-1] == "stratagem up"
    for line in lines[:-1]:
        words = shlex.split(line)
        assert words[0] == "export"
        for word in words[1:]:
            name, _, value = word.partition("=")
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    key = tmp_path / ".config" / "stratagem" / "openai.key"
    key.parent.mkdir(parents=True)
    key.write_text("sk-openai\n")
    settings = resolve_model(load_settings(state_dir=tmp_path / "state"))
    shown = {role: str(role_model(settings, role)) for role in ROLES}
    assert shown == {
        "perception": "qwen2.5:0.5b (weak)",
        "strategic": "llama3.2 (default)",
        "tactical": "llama3.2 (default)",
        "orchestrator": "gpt-4o (strong) at https://api.openai.com/v1",
    }
    assert "api_key=<set>" in repr(model_client("orchestrator", settings))
