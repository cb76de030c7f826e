"""``make clean`` removes what the tools and tests leave in the checkout, and nothing else: no
virtual environment, no database, no deployment's state."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> list[str]:
    lines = (REPO / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    start = lines.index(f"{target}:")
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_clean_removes_only_ignored_build_and_test_leftovers() -> None:
    [removal, *_] = _recipe("clean")
    assert removal.startswith("rm -rf ")
    removed = removal.removeprefix("rm -rf ").split()
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert set(removed) <= ignored, sorted(set(removed) - ignored)
    kept = {".stratagem", ".venv", ".otel-venv", ".model-venv", ".lowest-venv", ".pg"}
    assert not kept & set(removed)
    assert re.search(r"__pycache__", " ".join(_recipe("clean")))
