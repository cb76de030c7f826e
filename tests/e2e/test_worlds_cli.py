"""Worlds from the command line, against a deployment: a goal runs in the world it names (or a
fresh one), ``world list | show | reset``, a goal that already holds says so, bad names are one
line; and ``stratagem logs`` prints an agent's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[2]
LIGHTHOUSE = str(REPO / "examples" / "lighthouse.yaml")


def run(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="80")
    for name in ("STRATAGEM_EXTENSIONS", "RAY_ADDRESS"):
        env.pop(name, None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
        cwd=REPO,
    )


def ok(*args: str, state_dir: Path) -> str:
    result = run(*args, state_dir=state_dir)
    assert result.returncode == 0, (args, result.stderr[-2000:])
    return result.stdout


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("worlds")
    up = run("up", state_dir=state_dir)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        # The agents table fits an 80-column terminal and names every agent's endpoint.
        assert max(map(len, up.stdout.splitlines())) <= 80, up.stdout
        for role in ("orchestrator", "perception", "strategic", "tactical"):
            assert role in up.stdout
        yield state_dir
    finally:
        run("down", state_dir=state_dir)


HELD = """
goal: Ada climbs to the lamp room
passage: Ada stands in the lamp room. The lamp room leads to the stair.
beats: 1
world: lab
"""


def test_a_named_world_is_listed_shown_and_reset(deployed: Path, tmp_path: Path) -> None:
    first = json.loads(ok("submit", LIGHTHOUSE, "--world", "lab", "--json", state_dir=deployed))
    assert (first["status"], first["world"]) == ("succeeded", "lab")
    listed = json.loads(ok("world", "list", "--json", state_dir=deployed))
    assert "lab" in [w["name"] for w in listed["worlds"]]
    shown = json.loads(ok("world", "show", "lab", "--json", state_dir=deployed))
    facts = {f"{f['predicate']}({f['subject']}, {f['object']})" for f in shown["facts"]}
    assert "at(ada, lamp_room)" in facts

    # A goal (its world in its file) that holds before any action says so.
    held = tmp_path / "held.yaml"
    held.write_text(HELD, encoding="utf-8")
    again = json.loads(ok("submit", str(held), "--json", state_dir=deployed))
    assert (again["status"], again["world"]) == ("already_holds", "lab"), again["response"]
    assert again["response"]["actions"] == []
    assert "already holds in world 'lab' before any action" in again["response"]["note"]
    pretty = ok("submit", str(held), state_dir=deployed)
    assert "already holds: the goal already holds in world 'lab'" in " ".join(pretty.split())
    assert max(map(len, pretty.splitlines())) <= 80

    reset = ok("world", "reset", "lab", state_dir=deployed)
    assert "world lab reset:" in reset
    emptied = json.loads(ok("world", "show", "lab", "--json", state_dir=deployed))
    assert (emptied["entities"], emptied["facts"]) == ([], [])
    # After the reset the goal starts from its passage alone, and is reached again.
    third = json.loads(ok("submit", LIGHTHOUSE, "--world", "lab", "--json", state_dir=deployed))
    assert third["status"] == "succeeded"
    assert third["response"]["actions"]


def test_a_goal_naming_no_world_gets_a_fresh_one(deployed: Path) -> None:
    out = json.loads(ok("submit", LIGHTHOUSE, "--json", state_dir=deployed))
    assert out["world"] == out["plan_id"]
    assert out["status"] == "succeeded"
    shown = ok("world", "show", out["world"], state_dir=deployed)
    assert f"world {out['world']}" in shown
    assert max(map(len, shown.splitlines())) <= 80


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("world", "show", "nowhere"), "no world 'nowhere'; worlds: "),
        (("world", "reset", "Bad Name"), "world name 'Bad Name' is not valid: a lowercase"),
        (("submit", LIGHTHOUSE, "--world", "Bad Name"), "invalid --world: world: String should"),
    ],
)
def test_a_bad_world_is_one_line_and_exit_2(
    deployed: Path, args: tuple[str, ...], fragment: str
) -> None:
    result = run(*args, state_dir=deployed)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


def test_an_agent_log_is_printed(deployed: Path) -> None:
    out = ok("logs", "perception", "-n", "200", state_dir=deployed)
    assert "agent perception serving on" in out, out[-2000:]
