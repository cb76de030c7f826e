"""Extensions belong to the deployment: ``stratagem up`` records the set it deployed, every later
command uses it from any shell and folder, and ``up`` with another set redeploys exactly the agents
that loaded the old one and removes the agents no extension defines any more (no orphan)."""

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
CRITIC = "examples.extensions.critic"
WORD_COUNT = "examples.extensions.word_count"
BUILT_IN = {"orchestrator", "perception", "strategic", "tactical"}
REVIEWED = {
    "plan": {
        "id": "p",
        "owner": "strategic",
        "goal": "g",
        "steps": [{"kind": "tool", "id": "a", "tool": "match_patterns", "input": {}}],
    }
}


def run(*args: str, state_dir: Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``stratagem ARGS`` from a shell that never named an extension."""
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="80")
    for name in ("STRATAGEM_EXTENSIONS", "STRATAGEM_EXTENSION_PATHS", "RAY_ADDRESS"):
        env.pop(name, None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
        cwd=cwd,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert isinstance(answer, dict)
    return answer


def _pids(state_dir: Path) -> dict[str, int]:
    status = _ok(run("status", "--json", state_dir=state_dir))
    return {agent["role"]: agent["pid"] for agent in status["agents"]}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("extensions")
    try:
        yield folder
    finally:
        run("down", state_dir=folder)


def test_an_extension_is_known_in_a_fresh_shell(state_dir: Path, tmp_path: Path) -> None:
    up = _ok(run("up", "--extensions", CRITIC, "--json", state_dir=state_dir))
    assert up["extensions"] == [CRITIC]
    assert {a["role"] for a in up["agents"]} == {*BUILT_IN, "critic"}  # type: ignore[attr-defined]
    # Another shell, in another folder, with no STRATAGEM_EXTENSIONS.
    assert set(_pids(state_dir)) == {*BUILT_IN, "critic"}
    review = _ok(
        run(
            "request",
            "critic",
            "ReviewPlan",
            "--json",
            json.dumps(REVIEWED),
            state_dir=state_dir,
            cwd=tmp_path,
        )
    )
    assert review["verdict"] == "unsound"
    ran = _ok(
        run(
            "plans",
            "run",
            str(REPO / "examples" / "plans" / "critic-review.yaml"),
            "--json",
            state_dir=state_dir,
            cwd=tmp_path,
        )
    )
    assert ran["status"] == "succeeded", ran


def test_up_with_another_set_replaces_the_changed_agents_and_leaves_no_orphan(
    state_dir: Path, tmp_path: Path
) -> None:
    before = _pids(state_dir)
    assert "critic" in before
    up = _ok(run("up", "--extensions", WORD_COUNT, "--json", state_dir=state_dir))
    assert up["removed"] == ["critic"]
    assert set(up["replaced"]) == BUILT_IN  # type: ignore[arg-type]
    after = _pids(state_dir)
    assert set(after) == BUILT_IN
    assert all(after[role] != before[role] for role in BUILT_IN)
    counted = _ok(
        run(
            "request",
            "strategic",
            "CountWords",
            "--json",
            '{"text": "Mira waits in the courtyard."}',
            state_dir=state_dir,
            cwd=tmp_path,
        )
    )
    assert counted["words"] == 5
    gone = run("request", "critic", "ReviewPlan", "--json", "{}", state_dir=state_dir)
    assert gone.returncode == 2
    assert "unknown agent 'critic'" in gone.stderr
    # The same set again, from a shell that names none: nothing changes.
    again = _ok(run("up", "--json", state_dir=state_dir, cwd=tmp_path))
    assert (again["replaced"], again["removed"], again["extensions"]) == ([], [], [WORD_COUNT])
    assert _pids(state_dir) == after


def test_down_forgets_the_set(state_dir: Path) -> None:
    assert (state_dir / "deployment.json").is_file()
    down = run("down", state_dir=state_dir)
    assert down.returncode == 0, down.stderr[-2000:]
    assert not (state_dir / "deployment.json").exists()
