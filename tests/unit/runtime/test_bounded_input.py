"""Hostile files, payloads and deadlines get one line on stderr and exit code 2 from the CLI."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[3]
GOAL = str(REPO / "examples" / "crown.yaml")


def _limit_memory() -> None:
    # Without the bound, `submit /dev/zero` grew without end: cap it so a regression fails, not
    # the machine.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def run(*args: str, state_dir: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="160", **env_extra)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
        cwd=REPO,
        preexec_fn=_limit_memory,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr[-3000:]
    assert fragment in lines[0]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"\x00\xff\xfe\x89PNG\r\n", "is not UTF-8 text"),
        ("goal: caf\xe9 au lait\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9"),
        (_nested(100_000).encode(), "nested deeper than"),
        (("goal: " + _nested(100) + "\n").encode(), "nested deeper than 64 levels"),
        (("goal: " + "9" * 5000 + "\n").encode(), "cannot be read"),
        (
            b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + b"".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)},"
                f" *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)},"
                f" *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n".encode()
                for i in range(8)
            ),
            "more than",
        ),
    ],
    ids=["binary", "latin-1", "nested-100000", "nested-100", "huge-int", "alias-bomb"],
)
def test_a_hostile_goal_file_is_one_line(content: bytes, fragment: str, tmp_path: Path) -> None:
    goal = tmp_path / "goal.yaml"
    goal.write_bytes(content)
    assert_one_line(run("submit", str(goal), state_dir=tmp_path), fragment)


def test_submit_dev_zero_reads_a_bounded_prefix(tmp_path: Path) -> None:
    assert_one_line(run("submit", "/dev/zero", state_dir=tmp_path), "larger than")


def test_a_huge_file_is_refused_by_size(tmp_path: Path) -> None:
    goal = tmp_path / "goal.yaml"
    with goal.open("wb") as f:
        f.truncate(64 << 20)
    assert_one_line(run("submit", str(goal), state_dir=tmp_path), "larger than")


def test_a_fifo_without_a_writer_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "goal.fifo"
    os.mkfifo(fifo)
    assert_one_line(run("submit", str(fifo), state_dir=tmp_path), "must hold a mapping")


def test_a_hostile_plan_file_is_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"id": "p", "owner": "strategic", "steps": ' + _nested(100_000) + "}")
    assert_one_line(run("plans", "run", str(plan), state_dir=tmp_path), "nested deeper than")


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ('{"text": ' + _nested(50_000) + "}", "nested deeper than"),
        ('{"text": ' + "7" * 5000 + "}", "cannot be read"),
    ],
    ids=["nested", "huge-int"],
)
def test_a_hostile_json_payload_is_one_line(payload: str, fragment: str, tmp_path: Path) -> None:
    result = run("request", "perception", "ExtractEntities", "--json", payload, state_dir=tmp_path)
    assert_one_line(result, fragment)


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "-1", "0", "-inf"])
def test_a_timeout_out_of_range_is_one_line(value: str, tmp_path: Path) -> None:
    result = run("submit", GOAL, "--timeout", value, state_dir=tmp_path)
    assert_one_line(result, "--timeout must be a number of seconds")
    assert not (tmp_path / "local-ray.json").exists()  # refused before anything started


@pytest.mark.parametrize("command", [("submit", GOAL), ("demo",)])
def test_a_goal_deadline_no_goal_could_meet_is_refused_up_front(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    # Before: `submit --timeout 0.001` looked for the deployment first and failed 5.7 s later.
    result = run(*command, "--timeout", "0.001", state_dir=tmp_path)
    assert_one_line(result, "--timeout 0.001 s is too short for a goal")
    assert "give at least 1" in result.stderr
    assert not (tmp_path / "local-ray.json").exists()  # refused before anything started


def test_a_timeout_in_range_is_accepted() -> None:
    from stratagem.runtime.operator._input import check_timeout

    assert check_timeout(30.0) == 30.0
    assert check_timeout(None) is None


def _plan(tmp_path: Path, steps: int, text: str) -> Path:
    plan = {
        "id": "big",
        "owner": "strategic",
        "goal": "find the protagonist",
        "steps": [
            {
                "kind": "tool",
                "id": f"s{i}",
                "tool": "find_protagonist",
                "input": {"text": text, "entities": []},
            }
            for i in range(steps)
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_a_plan_past_the_step_limit_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    result = run("plans", "run", str(_plan(tmp_path, 10_000, "Mira.")), state_dir=tmp_path)
    assert_one_line(result, "has 10000 steps; the CLI sends at most 5000")
    assert not (tmp_path / "local-ray.json").exists()


def test_a_plan_past_the_message_size_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 20, "Mira waits in the hall. " * 10)
    result = run("plans", "run", str(plan), state_dir=tmp_path, STRATAGEM_MAX_MESSAGE_BYTES="2048")
    assert_one_line(result, "the agents accept requests up to 2048 bytes")
    assert not (tmp_path / "local-ray.json").exists()
