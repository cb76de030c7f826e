"""The documentation pages' shell blocks, and their Python blocks that need a deployment, run as a
reader runs them (``tests/docs_blocks.py`` for which blocks and how they are marked).

Per page, in a folder of its own (with ``examples/`` and ``proto/`` of the repository, and its
state folder ``.stratagem``), with ``.venv/bin`` first on ``PATH``: the page's ``bash`` and
``console`` blocks run in order, each as one script that stops at its first failing command; a
block that starts a deployment (a ``stratagem up`` line) starts from none, the page's earlier one
taken down first. A page with a ``<!-- run: deployed -->`` Python block gets one deployment before
its blocks run, and its Python blocks run after them, in order, in one interpreter. Whatever ran
is taken down at the end. Run with ``-s`` to see what each block printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_blocks import REPO, Block, blocks, console_commands, pages

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BIN = Path(sys.executable).parent
SHELL = ("bash", "console")


def _runs_here(block: Block) -> bool:
    return block.runs and (block.language in SHELL or block.deployed)


PAGES = [page for page in pages() if any(_runs_here(b) for b in blocks(page))]


class Reader:
    """A reader of one page: a folder, a state folder, the environment the page assumes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for shared in ("examples", "proto"):
            (folder / shared).symlink_to(REPO / shared)
        self.env = dict(os.environ, STRATAGEM_STATE_DIR=str(folder / ".stratagem"), COLUMNS="80")
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        for name in (
            "STRATAGEM_EXTENSIONS",
            "STRATAGEM_SECRET_FILE",
            "RAY_ADDRESS",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ):
            self.env.pop(name, None)
        self.up = False

    def run(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        ran = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=600,
            env=self.env,
            cwd=self.folder,
            check=False,
        )
        print(f"\n--- {what} (exit {ran.returncode})\n{ran.stdout}", end="")
        return ran

    def shell(self, block: Block) -> None:
        script = console_commands(block.text) if block.language == "console" else block.text
        if re.search(r"^\s*(\S*/)?stratagem up\b", script, re.M):
            self.down()
            self.up = True
        ran = self.run(["bash", "-e", "-o", "pipefail", "-c", script], block.where)
        assert ran.returncode == 0, (block.where, script, ran.stderr[-3000:])

    def deploy(self) -> None:
        ran = self.run([str(BIN / "stratagem"), "up"], "stratagem up")
        self.up = True
        assert ran.returncode == 0, ran.stderr[-3000:]

    def down(self) -> None:
        if self.up:
            ran = self.run([str(BIN / "stratagem"), "down"], "stratagem down")
            assert ran.returncode == 0, ran.stderr[-3000:]
            self.up = False


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    page_reader = Reader(tmp_path)
    try:
        yield page_reader
    finally:
        page_reader.down()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_page_runs(page: Path, reader: Reader) -> None:
    found = blocks(page)
    if any(b.runs and b.deployed for b in found):
        reader.deploy()
    for block in found:
        if block.runs and block.language in SHELL:
            reader.shell(block)
    python = [b for b in found if b.runs and b.language == "python"]
    if any(b.deployed for b in python):
        code = "\n".join(b.text for b in python)
        ran = reader.run([sys.executable, "-c", code], f"{page.name}: its Python blocks")
        assert ran.returncode == 0, ran.stderr[-3000:]
