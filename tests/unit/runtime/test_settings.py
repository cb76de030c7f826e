"""Settings for durable agents: per-agent store paths, answer retention from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratagem.runtime import load_settings


def test_each_agent_has_its_own_plan_and_answer_store(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    assert settings.plans_path("tactical") == tmp_path / "tactical.plans.sqlite3"
    assert settings.answers_path("tactical") == tmp_path / "tactical.answers.sqlite3"


def test_answer_retention_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATAGEM_ANSWER_RETENTION_COUNT", "10")
    monkeypatch.setenv("STRATAGEM_ANSWER_RETENTION_S", "3600")
    settings = load_settings()
    assert (settings.answer_retention_count, settings.answer_retention_s) == (10, 3600.0)
    assert load_settings(answer_retention_count=5).answer_retention_count == 5


def test_every_setting_is_documented_in_the_configuration_page() -> None:
    import re
    from pathlib import Path

    from stratagem.runtime import Settings

    page = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
    documented = set(re.findall(r"`(STRATAGEM_[A-Z0-9_]+)`", page.read_text(encoding="utf-8")))
    settings = {f"STRATAGEM_{name.upper()}" for name in Settings.model_fields}
    assert settings <= documented, sorted(settings - documented)


def test_placement_comes_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from stratagem.runtime.host._launcher import placement_options

    monkeypatch.setenv(
        "STRATAGEM_PLACEMENT",
        '{"perception": {"labels": {"zone": "b"}}, "tactical": {"resources": {"edge": 0.01}}}',
    )
    settings = load_settings()
    assert placement_options(settings, "perception") == {"label_selector": {"zone": "b"}}
    assert placement_options(settings, "tactical") == {"resources": {"edge": 0.01}}
    assert placement_options(settings, "strategic") == {}


@pytest.mark.parametrize(
    ("placement", "complaint"),
    [
        ('{"percepton": {}}', "unknown role 'percepton'"),
        ('{"tactical": {"resources": {"edge": 0}}}', "an amount above 0"),
        ('{"tactical": {"resources": {"CPU": 1}}}', "not a custom resource"),
        ('{"tactical": {"nodes": ["a"]}}', "Extra inputs are not permitted"),
        ("{not json", "placement"),
    ],
)
def test_a_bad_placement_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, placement: str, complaint: str
) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("STRATAGEM_PLACEMENT", placement)
    with pytest.raises((ValidationError, ValueError)) as caught:
        load_settings()
    assert complaint in str(caught.value)


def test_the_watch_stream_limit_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATAGEM_MAX_WATCH_STREAMS", "7")
    assert load_settings().max_watch_streams == 7


def test_external_a2a_agents_come_from_the_environment_and_keep_their_token_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stratagem.agents._a2a import peers_from

    monkeypatch.setenv(
        "STRATAGEM_A2A_AGENTS",
        '{"translator": {"url": "http://127.0.0.1:9999/", "token": "s3cret", "skill": "fr"}}',
    )
    monkeypatch.setenv("STRATAGEM_A2A_PORTS", '{"perception": 8101}')
    settings = load_settings()
    assert settings.a2a_ports == {"perception": 8101}
    peer = settings.a2a_agents["translator"]
    assert (peer.url, peer.skill) == ("http://127.0.0.1:9999/", "fr")
    # The token never travels in the settings the agents are given, nor shows in their repr.
    assert "s3cret" not in settings.model_dump_json()
    assert "s3cret" not in repr(settings)
    assert peers_from(settings.a2a_agents)["translator"].token == "s3cret"
    assert "s3cret" not in repr(peers_from(settings.a2a_agents))


def test_a_bad_external_a2a_agent_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATAGEM_A2A_AGENTS", '{"x": {"url": "ftp://nowhere"}}')
    with pytest.raises(Exception, match="url"):
        load_settings()


def test_the_webhooks_allowed_networks_come_as_cidrs_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ipaddress

    from pydantic import ValidationError

    monkeypatch.setenv("STRATAGEM_GATE_WEBHOOK_ALLOWED_NETWORKS", "10.20.0.0/16, 127.0.0.1,::1")
    assert load_settings().gate_webhook_allowed_networks == [
        ipaddress.ip_network("10.20.0.0/16"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    ]
    assert load_settings(gate_webhook_allowed_networks=[]).gate_webhook_allowed_networks == []
    monkeypatch.setenv("STRATAGEM_GATE_WEBHOOK_ALLOWED_NETWORKS", "10.20.0.0/16,intranet")
    with pytest.raises(ValidationError, match="'intranet' is not a network"):
        load_settings()


def test_model_tiers_and_role_tiers_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "STRATAGEM_MODEL_TIERS",
        '{"weak": "qwen-0.5b", "strong": {"model": "big", "url": "http://10.0.0.2:8000/v1"}}',
    )
    monkeypatch.setenv("STRATAGEM_ROLE_TIERS", '{"perception": "weak", "orchestrator": "strong"}')
    settings = load_settings()
    assert settings.model_tiers["weak"].model == "qwen-0.5b"
    assert settings.model_tiers["weak"].url is None
    assert settings.model_tiers["strong"].url == "http://10.0.0.2:8000/v1"
    assert settings.role_tiers == {"perception": "weak", "orchestrator": "strong"}
    # unset: every role on the default tier, as before tiers existed
    monkeypatch.delenv("STRATAGEM_MODEL_TIERS")
    monkeypatch.delenv("STRATAGEM_ROLE_TIERS")
    assert (load_settings().model_tiers, load_settings().role_tiers) == ({}, {})


@pytest.mark.parametrize(
    ("tiers", "role_tiers", "complaint"),
    [
        ("{}", '{"orchestrator": "strong"}', "orchestrator is on the 'strong' tier, which is not"),
        ('{"weak": "s"}', '{"tactical": "strong"}', "tactical is on the 'strong' tier"),
        ("{}", '{"orchestrator": "huge"}', "role_tiers.orchestrator"),
        ('{"default": "m"}', "{}", "model_tiers.default"),
        ('{"huge": "m"}', "{}", "model_tiers.huge"),
        ('{"weak": ""}', "{}", "model_tiers.weak.model"),
        ('{"weak": {"model": "m", "url": "ftp://h"}}', "{}", "model_tiers.weak.url"),
        ('{"weak": {"model": "m", "key": "k"}}', "{}", "model_tiers.weak.key"),
        ("{}", '{"percepton": "default"}', "role_tiers: unknown role 'percepton'"),
    ],
)
def test_a_tier_named_but_not_configured_or_malformed_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tiers: str, role_tiers: str, complaint: str
) -> None:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    monkeypatch.setenv("STRATAGEM_MODEL_TIERS", tiers)
    monkeypatch.setenv("STRATAGEM_ROLE_TIERS", role_tiers)
    with pytest.raises((ValidationError, SettingsError)) as caught:
        load_settings()
    assert complaint in str(caught.value)


def test_the_cli_refuses_an_unconfigured_tier_in_one_line_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from stratagem.runtime._cli import app

    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("STRATAGEM_ROLE_TIERS", '{"orchestrator": "strong"}')
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 2, result.output
    assert "orchestrator is on the 'strong' tier, which is not configured" in " ".join(
        result.output.split()
    )
    assert "Traceback" not in result.output


def test_a_tiers_key_file_needs_its_own_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("STRATAGEM_MODEL_TIERS", '{"weak": {"model": "m", "api_key_file": "k"}}')
    with pytest.raises(ValidationError, match="api_key_file needs the tier's own url"):
        load_settings()
