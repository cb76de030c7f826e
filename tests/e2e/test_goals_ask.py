"""Goals in plain words as a user runs them: ``stratagem up`` with the example domain
(``examples/extensions/assistant.py``: weather, timer, calendar) on a local Ray, then
``stratagem ask`` with the seed's sentence, its failing-weather variant, ``--plan-only``, a goal
file without a passage through ``submit``, and the bad input the issue names: the commands of
docs/goals.md's "Goals in plain words"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[2]
ASSISTANT = "examples.extensions.assistant"
SEED = "check the weather in Seattle and set a timer for 10 minutes"


def run(*args: str, state_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``stratagem ARGS`` from the checkout, against the deployment in ``state_dir``."""
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="200")
    env.pop("RAY_ADDRESS", None)
    env.pop("STRATAGEM_EXTENSIONS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("goals-ask")
    up = run("up", "--extensions", ASSISTANT, "--json", state_dir=state_dir, timeout=600)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        roles = {a["role"] for a in json.loads(up.stdout)["agents"]}
        assert {"orchestrator", "weather", "timer", "calendar"} <= roles
        yield state_dir
    finally:
        down = run("down", "--json", state_dir=state_dir)
        assert down.returncode == 0, down.stderr[-2000:]


def test_the_seed_sentence_runs_across_two_agents(deployed: Path) -> None:
    result = run("ask", SEED, "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["route"], answer["revisions"]) == ("succeeded", "plan", 1)
    assert [(s["agent"], s["capability"], s["status"]) for s in answer["steps"]] == [
        ("weather", "GetWeather", "succeeded"),
        ("timer", "SetTimer", "succeeded"),
    ]
    assert json.loads(answer["steps"][0]["request_json"]) == {"city": "Seattle"}
    assert json.loads(answer["steps"][1]["output_json"])["minutes"] == 10
    assert answer["summary"].splitlines()[0] == (
        "done: check the weather in Seattle: Seattle: 52°F, partly cloudy"
    )
    # The orchestrator's plan called the weather and timer agents: their sub-plans are there.
    shown = run("plans", "show", answer["plan_id"], "--json", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert answer["plan_id"] in shown.stdout


def test_the_failing_weather_variant_is_replanned_and_sets_the_timer(deployed: Path) -> None:
    result = run(
        "ask",
        "check the weather in Atlantis and set a timer for 10 minutes",
        "--json",
        state_dir=deployed,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["revisions"]) == ("partial", 2)
    assert [s["status"] for s in answer["steps"]] == ["dropped", "succeeded"]
    assert "no weather for 'Atlantis'" in answer["steps"][0]["error"]
    lines = answer["summary"].splitlines()
    assert lines[0].startswith("not done: check the weather in Atlantis: get_weather failed")
    assert lines[1].startswith("done: set a timer for 10 minutes: timer ")


def test_plan_only_prints_the_dag_and_runs_nothing(deployed: Path) -> None:
    result = run(
        "ask", "--plan-only", "find my next meeting and set a timer for it", state_dir=deployed
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "calendar.NextMeeting" in out
    assert "timer.SetTimer (side effects)" in out
    assert "minutes=next_meeting.minutes" in out
    assert "planned 2 step(s); nothing ran" in out


def test_a_goal_file_without_a_passage_is_asked(deployed: Path, tmp_path: Path) -> None:
    goal = tmp_path / "goal.yaml"
    goal.write_text("goal: what is the weather like in Paris\n", encoding="utf-8")
    result = run("submit", str(goal), "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["route"]) == ("succeeded", "single")
    assert "Paris: 61°F, sunny" in answer["summary"]


@pytest.mark.parametrize(
    ("goal", "says"),
    [
        ("book a flight to Paris", "no capability matches 'book a flight to Paris'"),
        ("", "goal: String should have at least 1 character"),
        ("   ", "goal: Value error, the goal is empty"),
        ("x" * 100_000, "goal: String should have at most 2000 characters"),
        ("ask the billing agent for my invoice", "names the agent 'billing', which is not"),
        ("set a timer for 5000 minutes", "minutes=5000: Input should be less than or equal"),
        (f"{SEED}|--done|BookFlight", "done_when: 'BookFlight' names no step of the goal's plan"),
        (f"{SEED}|--deadline|0", "deadline_s: Input should be greater than 0"),
    ],
)
def test_bad_goals_are_one_line_and_exit_2(deployed: Path, goal: str, says: str) -> None:
    result = run("ask", *goal.split("|"), state_dir=deployed)
    assert result.returncode == 2, (result.stdout[-500:], result.stderr[-2000:])
    assert says in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "Traceback" not in result.stderr


def test_the_audit_chain_holds(deployed: Path) -> None:
    result = run("audit", "verify", "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_extension_whose_intent_names_no_field_stops_up_in_one_line(tmp_path: Path) -> None:
    source = (REPO / "examples" / "extensions" / "assistant.py").read_text(encoding="utf-8")
    bad = tmp_path / "my_agents.py"
    bad.write_text(source.replace('"weather in {city}"', '"weather in {town}"'), encoding="utf-8")
    result = run("up", "--extensions", str(bad), state_dir=tmp_path / "state", timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: extension '{bad}': agent 'weather': capability 'GetWeather': intent "
        "'weather in {town}': slot {town} is not a field of GetWeatherRequest (fields: city)"
    )
    assert not (tmp_path / "state" / "local-ray.json").exists()


def test_approve_holds_the_timer_at_its_gate_until_approved(deployed: Path) -> None:
    held = run("ask", SEED, "--approve", "--plan-id", "held-goal", state_dir=deployed)
    assert held.returncode == 3, held.stderr[-2000:]
    assert "stratagem approve held-goal approve" in held.stdout
    approved = run("approve", "held-goal", "approve", "--rationale", "set it", state_dir=deployed)
    assert approved.returncode == 0, approved.stderr[-2000:]
    watched = run("plans", "watch", "held-goal", state_dir=deployed)
    assert watched.returncode == 0, watched.stderr[-2000:]
    shown = run("plans", "show", "held-goal", "--json", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert '"succeeded"' in shown.stdout
    assert "held-goal/set_timer" in shown.stdout


def test_an_unreachable_weather_service_is_retried_then_replanned(deployed: Path) -> None:
    # Vostok's station is offline (class transient) each time it is asked: after the retries the
    # goal is replanned as for a refusal; with --done naming the timer, the goal is done.
    # Last in the module: the retries open the weather tool's circuit breaker (30 s), which then
    # refuses every city's weather, as it should during an outage.
    result = run(
        "ask",
        "check the weather in Vostok and set a timer for 10 minutes",
        "--done",
        "SetTimer",
        "--json",
        state_dir=deployed,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["status"], answer["revisions"], answer["done"]) == ("partial", 2, True)
    assert [s["status"] for s in answer["steps"]] == ["dropped", "succeeded"]
    assert answer["summary"].splitlines()[-1] == "definition of done: met (SetTimer)"
