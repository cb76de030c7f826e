"""The runtime knows the agents extensions define: settings, policy, the operator, the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError
from typer.testing import CliRunner

from stratagem import agents
from stratagem.protocol import ROLES, roles
from stratagem.runtime import InputError, Operator, deployment_roles, load_policy, load_settings
from stratagem.runtime._cli import app
from stratagem.runtime.config._extensions import ENTRY_POINT_GROUP
from tests.unit._registry import registries_kept

CRITIC = "examples.extensions.critic"
REPO = Path(__file__).resolve().parents[3]
FIVE = (*ROLES, "critic")


@pytest.fixture(autouse=True)
def _kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(tmp_path / "state"))
    for name in ("EXTENSIONS", "PORTS", "PLACEMENT", "PLANNERS", "POLICY_FILE"):
        monkeypatch.delenv(f"STRATAGEM_{name}", raising=False)
    with registries_kept():
        yield


def test_the_entry_point_group_is_the_agents_one() -> None:
    assert ENTRY_POINT_GROUP == agents.ENTRY_POINT_GROUP


def test_deployment_roles_are_the_four_then_those_extensions_define() -> None:
    assert deployment_roles([]) == ROLES
    assert deployment_roles([CRITIC]) == FIVE
    assert roles() == FIVE


def test_an_extension_that_defines_an_agent_badly_is_one_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "twice.py"
    bad.write_text(
        "from stratagem.agents import define_agent\n"
        "from stratagem.agents import StrategicPlan, StrategicPlanner\n"
        "AGENT = define_agent('strategic', plan_type=StrategicPlan, planner=StrategicPlanner)\n",
        encoding="utf-8",
    )
    with pytest.raises(InputError) as info:
        deployment_roles([str(bad)])
    assert str(info.value) == (
        f"extension {str(bad)!r}: agent 'strategic': the role is a built-in agent's; "
        "choose another name"
    )
    assert roles() == ROLES


def test_ports_placement_and_planners_may_name_an_extensions_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stratagem.runtime.host._launcher import placement_options

    monkeypatch.setenv("STRATAGEM_EXTENSIONS", CRITIC)
    monkeypatch.setenv("STRATAGEM_PORTS", '{"critic": 50123}')
    monkeypatch.setenv("STRATAGEM_PLACEMENT", '{"critic": {"labels": {"zone": "b"}}}')
    monkeypatch.setenv("STRATAGEM_PLANNERS", '{"critic": "deterministic"}')
    settings = load_settings()
    assert settings.ports == {"critic": 50123}
    assert placement_options(settings, "critic") == {"label_selector": {"zone": "b"}}
    assert settings.planner_for("critic") == "deterministic"


@pytest.mark.parametrize("setting", ["PORTS", "PLACEMENT", "PLANNERS"])
def test_a_role_no_agent_has_is_refused_naming_the_roles(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    value = {"PORTS": "50123", "PLACEMENT": "{}", "PLANNERS": '"model"'}[setting]
    monkeypatch.setenv(f"STRATAGEM_{setting}", f'{{"critic": {value}}}')
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value) == (
        f"{setting.lower()}: unknown role 'critic'; roles are: {', '.join(ROLES)}"
    )
    monkeypatch.setenv(f"STRATAGEM_{setting}", f'{{"Critic!": {value}}}')
    with pytest.raises(ValidationError, match="'Critic!' is not a role"):
        load_settings()


def test_the_policy_adds_the_entries_of_the_agents_defined(tmp_path: Path) -> None:
    plain = load_policy(load_settings())
    assert not plain.allows("orchestrator", "critic", "ReviewPlan")
    settings = load_settings(extensions=[CRITIC])
    policy = load_policy(settings)
    assert policy.allows("orchestrator", "critic", "ReviewPlan")
    assert not policy.allows("strategic", "critic", "ReviewPlan")
    # A policy file of one's own gets them too.
    own = tmp_path / "policy.toml"
    own.write_text(
        'version = 1\n[[allow]]\ncaller = "operator"\ntarget = "*"\ncapabilities = ["*"]\n'
    )
    mine = load_policy(load_settings(extensions=[CRITIC], policy_file=own))
    assert [rule.target for rule in mine.rules] == ["*", "critic", "*"]
    assert mine.allows("orchestrator", "critic", "ReviewPlan")


async def test_the_operator_knows_the_defined_agents() -> None:
    async with Operator(settings=load_settings()) as op:
        with pytest.raises(InputError, match="unknown agent 'critic'; valid: orchestrator, "):
            await op.describe("critic")
    async with Operator(settings=load_settings(extensions=[CRITIC])) as op:
        assert op.roles == FIVE
        with pytest.raises(InputError, match="unknown agent 'narrator'; valid: critic, "):
            await op.describe("narrator")
        with pytest.raises(InputError, match=r"owner must be one of .*, critic, not 'narrator'"):
            await op.run_plan({"id": "p", "owner": "narrator", "goal": "g", "steps": []})


@pytest.mark.parametrize(
    "args",
    [["describe", "narrator"], ["plans", "list", "--agent", "narrator"]],
)
def test_the_cli_lists_the_defined_agents_as_valid(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("STRATAGEM_EXTENSIONS", CRITIC)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "unknown agent 'narrator'; valid: critic, orchestrator," in " ".join(
        result.output.split()
    )


def test_up_with_a_bad_extension_stops_before_ray(tmp_path: Path) -> None:
    bad = tmp_path / "no_policy.py"
    bad.write_text(
        "from examples.extensions import critic\n"
        "from stratagem.agents import define_agent\n"
        "from stratagem.protocol import CapabilitySpec\n"
        "SPEC = CapabilitySpec('Judge', 'judge', 'extension', critic.ReviewPlanRequest,\n"
        "                      critic.ReviewPlanResponse)\n"
        "class JudgePlan(critic.CriticPlan): pass\n"
        "JUDGE = define_agent('judge', plan_type=JudgePlan, planner=critic.CriticPlanner,\n"
        "                     capabilities=[SPEC])\n",
        encoding="utf-8",
    )
    state = tmp_path / "state"
    result = CliRunner().invoke(
        app, ["up", "--state-dir", str(state)], env={"STRATAGEM_EXTENSIONS": str(bad)}
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0] == (
        f"error: extension {str(bad)!r}: agent 'judge': capability 'Judge' has no policy "
        "entry: name who may call it in callers (deny by default)"
    )
    assert not (state / "local-ray.json").exists()


def test_an_extension_exiting_on_import_is_one_line_naming_it_before_anything_starts(
    tmp_path: Path,
) -> None:
    quits = tmp_path / "quits.py"
    quits.write_text("raise SystemExit(0)\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        deployment_roles([str(quits)])
    assert str(info.value) == (f"extension {str(quits)!r}: importing {quits} failed: SystemExit: 0")
    # `up` stops on it in one line, exit 2, before a Ray head starts (no local-ray.json).
    state = tmp_path / "state"
    result = CliRunner().invoke(
        app, ["up", "--state-dir", str(state)], env={"STRATAGEM_EXTENSIONS": str(quits)}
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"error: extension {str(quits)!r}: importing {quits} failed: SystemExit: 0"]
    assert not (state / "local-ray.json").exists()


def test_an_extension_whose_import_does_not_finish_is_named_within_the_bound(
    tmp_path: Path,
) -> None:
    slow = tmp_path / "slow_to_import.py"
    slow.write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        deployment_roles([CRITIC, str(slow)], timeout_s=0.5)
    assert str(info.value) == (
        f"extension {slow}: its import did not finish within 0.5 s "
        "(STRATAGEM_EXTENSION_IMPORT_TIMEOUT_S); nothing was started"
    )
