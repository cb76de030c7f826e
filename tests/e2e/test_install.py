"""Stratagem installs beside the packages its users already have.

The distribution's import root is ``stratagem`` (the layer folders install as
``stratagem.agents``, ``stratagem.protocol``, ...), so it shares an environment with openai-agents,
whose import name is ``agents``. The test installs a copy of this repository (not an editable
install: that is how users get it) and openai-agents into a fresh virtual environment, then uses
both from a folder outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
# What a source distribution of the project holds: the metadata and the four layer folders.
DISTRIBUTED = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "agents",
    "planning",
    "protocol",
    "runtime",
)


def _copy_sources(dest: Path) -> None:
    dest.mkdir()
    for name in DISTRIBUTED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dest / name)


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{args[:3]} exit {result.returncode}:\n{result.stderr[-3000:]}"
    return result.stdout


def test_stratagem_and_openai_agents_work_in_one_environment(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _copy_sources(src)
    venv = tmp_path / "venv"
    bin_dir = venv / "bin"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env.pop("RAY_ADDRESS", None)
    env["STRATAGEM_STATE_DIR"] = str(tmp_path / "state")

    _run([sys.executable, "-m", "venv", str(venv)], work, env, 120)
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(src), "openai-agents"],
        work,
        env,
        900,
    )

    # Both import roots resolve to their own distributions, and openai-agents' Agent works.
    probe = (
        "import json, agents, stratagem.agents as sa\n"
        "a = agents.Agent(name='helper', instructions='answer briefly')\n"
        "print(json.dumps({'agents': agents.__file__, 'stratagem': sa.__file__,"
        " 'agent_name': a.name, 'same': agents.Agent is sa.Agent}))\n"
    )
    seen = json.loads(_run([str(bin_dir / "python"), "-c", probe], work, env, 120))
    site = str(venv)
    assert seen["agents"].startswith(site), seen
    assert seen["agents"].endswith(os.path.join("agents", "__init__.py")), seen
    assert seen["stratagem"].startswith(site), seen
    assert seen["stratagem"].endswith(os.path.join("stratagem", "agents", "__init__.py")), seen
    assert seen["agent_name"] == "helper"
    assert seen["same"] is False

    # No top-level module of the layer names comes from Stratagem's distribution.
    for layer in ("protocol", "planning", "runtime"):
        found = _run(
            [
                str(bin_dir / "python"),
                "-c",
                f"import importlib.util as u; print(u.find_spec({layer!r}) is None)",
            ],
            work,
            env,
            60,
        )
        assert found.strip() == "True", f"{layer} is importable at the top level"

    # The CLI from that environment runs the built-in goal end to end.
    out = json.loads(_run([str(bin_dir / "stratagem"), "demo", "--json"], work, env, 600))
    assert out["response"]["status"] == "succeeded"
    assert out["audit"]["ok"] is True
