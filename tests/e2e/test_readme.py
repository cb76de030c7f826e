"""The README's quick start and tutorial, run as a newcomer runs them: the commands extracted from
README.md, in a fresh state directory, in an 80-column terminal.

``make demo`` runs as the first block says (``make test``, the whole suite, is not run from inside
it); the deployment block runs line by line with ``.venv/bin`` first on ``PATH`` (what its
``source .venv/bin/activate`` does); then, on a deployment of its own, the tutorial's goal file,
its plan commands and its own-agent commands. Every command must succeed and print no line wider
than 80 columns. Run with ``-s`` to see what each printed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent


def _section(title: str) -> str:
    start = README.index(f"\n{title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    """The block's commands, comments dropped."""
    return [shlex.join(shlex.split(line, comments=True)) for line in block.splitlines() if line]


def _run(
    command: str, state_dir: Path, cwd: Path = REPO, *, expect: int = 0
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="80")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("STRATAGEM_EXTENSIONS", "RAY_ADDRESS", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        env.pop(name, None)
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
        cwd=cwd,
    )
    print(f"\n$ {command}   (exit {result.returncode})\n{result.stdout}", end="")
    assert result.returncode == expect, (command, result.stderr[-3000:])
    wide = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert not wide, (command, wide[:3])
    return result


def test_the_quick_start_runs_in_a_fresh_state_dir(tmp_path: Path) -> None:
    make, deployment = _blocks(_section("## Quick start"), "bash")
    # The two commands stay, first.
    assert _commands(make) == ["make demo", "make test"]
    demo = _run("make demo", tmp_path / "demo")
    assert "goal goal-" in demo.stdout
    assert "succeeded" in demo.stdout
    assert "Action sequence" in demo.stdout
    assert "chain verified" in demo.stdout

    commands = _commands(deployment)
    assert commands[0] == "source .venv/bin/activate"
    assert commands[1:3] == ["stratagem up", "stratagem submit examples/lighthouse.yaml"]
    assert commands[-1] == "stratagem down"
    outputs = {command: _run(command, tmp_path / "state").stdout for command in commands[1:]}
    submitted = outputs["stratagem submit examples/lighthouse.yaml"]
    [plan_id] = re.findall(r"goal (goal-[0-9a-f]{12}): succeeded", submitted)
    assert f"world {plan_id}" in submitted
    assert plan_id in outputs["stratagem plans list"]
    assert plan_id in outputs["stratagem world list"]
    assert "removed agents" in outputs["stratagem down"]


def test_the_tutorial_runs_against_a_deployment(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    tutorial = _section("## Tutorial")
    [goal] = _blocks(tutorial, "yaml")[:1]
    (tmp_path / "my-goal.yaml").write_text(goal, encoding="utf-8")
    _run("stratagem up", state_dir)
    try:
        ran = _run(f"stratagem submit {tmp_path / 'my-goal.yaml'}", state_dir)
        assert ": succeeded" in ran.stdout
        # Every bash block of the tutorial but the gates' (their plans wait for a decision) and
        # the A2A one (a script: its commands share a variable); the memory and research ones
        # among them, goals in plain words last.
        # The artifacts one runs in tests/integration/test_artifacts_on_ray.py (it needs a plan
        # that saved an artifact under a policy granting the tools).
        blocks = [
            b
            for b in _blocks(tutorial, "bash")
            if "approve" not in b and "a2a_url" not in b and "stratagem artifacts" not in b
        ]
        assert len(blocks) == 5
        plain_words = [b for b in blocks if "examples.extensions.assistant" in b]
        for block in [b for b in blocks if b not in plain_words]:
            for command in _commands(block):
                # The research report goes to the test's folder, not the repository's.
                _run(command.replace("--out research.md", f"--out {tmp_path / 'r.md'}"), state_dir)
        assert "## Findings" in (tmp_path / "r.md").read_text(encoding="utf-8")
        _the_gates_run(tutorial, state_dir)
        [a2a] = [b for b in _blocks(tutorial, "bash") if "a2a_url" in b]
        called = _run(a2a, state_dir)
        assert "ExtractEntities" in called.stdout.split()
        assert called.stdout.split()[-1] == "TASK_STATE_COMPLETED"
        # Goals in plain words, last: its `up` replaces the critic with the example domain.
        for command in _commands(plain_words[0]):
            _run(command, state_dir)
    finally:
        subprocess.run(
            [str(BIN / "stratagem"), "down"],
            env=dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir)),
            capture_output=True,
            timeout=300,
            check=False,
        )


def _the_gates_run(tutorial: str, state_dir: Path) -> None:
    """The gate blocks as the tutorial says: the plan waits (exit 3 and the approve command),
    an approval lets it go on, a gate that asks passes its value on, a fork runs from a step."""
    gated, asking = [b for b in _blocks(tutorial, "bash") if "approve" in b]
    waits = _run("stratagem plans run examples/plans/gated.yaml", state_dir, expect=3)
    assert "stratagem approve gated ask" in waits.stdout
    approve = next(c for c in _commands(gated) if c.startswith("stratagem approve"))
    _run(approve, state_dir)
    run, answer, fork = _commands(asking)
    assert "stratagem approve ask tension" in _run(run, state_dir, expect=3).stdout
    _run(answer, state_dir)
    forked = _run(fork, state_dir)
    shown = _run("stratagem plans show ask --full", state_dir).stdout
    assert "tension 0.80" in shown
    new_id = re.findall(r"plan (ask-fork-[0-9a-f]+) on strategic", forked.stdout)
    assert new_id, forked.stdout
    _run(f"stratagem plans watch {new_id[0]}", state_dir)
    assert "tension 0.20" in _run(f"stratagem plans show {new_id[0]} --full", state_dir).stdout
