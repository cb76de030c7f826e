"""The container image without a container engine: its build context and its entrypoint.

No Docker daemon runs here and no registry but PyPI is reachable, so the base image cannot be
pulled and ``docker build`` cannot run. What can be proven is done the way the Dockerfile does it,
read from the Dockerfile itself: the build context is assembled as ``Dockerfile.dockerignore``
filters the repository, every ``COPY`` source is in it, the pinned lock installs with
``--require-hashes --no-deps`` into a fresh Python, the project builds from the context alone
without build isolation (nothing unpinned is fetched), and the image's ``ENTRYPOINT`` runs its
``CMD`` and the built-in goal (``demo``) with the image's ``ENV``. Not proven here: the base
image, the Debian packages (tini, wget), the non-root user and the file system layout; CI with a
Docker engine runs ``docker build`` for those (deploy/README.md).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
IGNORE = REPO / "deploy" / "Dockerfile.dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _ignored(relative: str, patterns: list[str]) -> bool:
    """BuildKit's rule: the last pattern that matches decides; ``!`` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        candidates = {pattern, pattern.replace("**/", "")}
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern == "**" or any(
            fnmatch.fnmatchcase(prefix, c) for prefix in prefixes for c in candidates
        ):
            ignored = not negate
    return ignored


def _context(dest: Path) -> list[str]:
    patterns = [
        line.strip()
        for line in IGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    kept = [path for path in tracked if not _ignored(path, patterns)]
    for path in kept:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, target)
    return kept


def test_the_build_context_and_entrypoint_work_as_the_dockerfile_says(tmp_path: Path) -> None:
    steps = _instructions()
    context = tmp_path / "context"
    kept = _context(context)
    assert "pyproject.toml" in kept
    assert not any(path.startswith(("tests/", ".ci/", "docs/")) for path in kept)

    # Every COPY source is in the context.
    copies = [shlex.split(args) for word, args in steps if word == "COPY"]
    assert copies
    for parts in copies:
        sources = [p for p in parts[:-1] if not p.startswith("--")]
        for source in sources:
            assert (context / source).exists(), f"COPY {source}: not in the build context"

    venv = tmp_path / "image-python"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env.pop("RAY_ADDRESS", None)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)

    # The RUN steps that install Python packages, with the context where the image has it.
    runs = [args for word, args in steps if word == "RUN" and "pip install" in args]
    assert any("--require-hashes" in run for run in runs)
    lock = context / "deploy" / "requirements.lock"
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--require-hashes",
            "--no-deps",
            "-r",
            str(lock),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert any("--no-build-isolation" in run for run in runs)
    built = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(context),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    check = subprocess.run(
        [str(python), "-m", "pip", "check"], capture_output=True, text=True, env=env, check=False
    )
    assert check.returncode == 0, check.stdout[-3000:]

    # The entrypoint, its default command, and the built-in goal with the image's settings.
    (entrypoint,) = [json.loads(args) for word, args in steps if word == "ENTRYPOINT"]
    (cmd,) = [json.loads(args) for word, args in steps if word == "CMD"]
    assert entrypoint[-1] == "stratagem"
    stratagem = str(venv / "bin" / "stratagem")
    image_env = dict(env)
    for word, args in steps:
        if word == "ENV":
            for assignment in shlex.split(args):
                key, _, value = assignment.partition("=")
                image_env[key] = value
    state = tmp_path / "var-lib-stratagem"
    image_env["STRATAGEM_STATE_DIR"] = str(state)  # the image's volume, here a folder
    home = tmp_path / "home"
    shutil.copytree(context / "examples", home / "examples")
    shown = subprocess.run(
        [stratagem, *cmd], capture_output=True, text=True, env=image_env, cwd=home, timeout=120
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "demo" in shown.stdout
    demo = subprocess.run(
        [stratagem, "demo", "--json"],
        capture_output=True,
        text=True,
        env=image_env,
        cwd=home,
        timeout=600,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert json.loads(demo.stdout)["response"]["status"] == "succeeded"
