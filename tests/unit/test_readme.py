"""The README stays a newcomer's page: short, the two commands first, every page it sends the
reader to there (the quick start itself runs in ``tests/e2e/test_readme.py``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_opens_with_the_quick_start() -> None:
    # 300 until the tutorial grew goals in plain words, memory, artifacts and research (§8-§10).
    assert len(README.splitlines()) <= 330
    sections = re.findall(r"^## (.+)$", README, re.M)
    assert sections[:3] == ["Quick start", "Concepts", "Tutorial"]
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    assert [line.split("#")[0].strip() for line in first_block.group(1).splitlines()] == [
        "make demo",
        "make test",
    ]


def test_every_page_the_docs_name_exists() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for named in set(
            re.findall(r"`((?:docs|deploy|examples)/[\w./-]+\.(?:md|yaml|py))`", text)
        ):
            assert (REPO / named).is_file(), f"{page.name} names {named}, which is not there"
