"""The code blocks of the documentation pages (``docs/*.md``), as the docs runner reads them.

Every fenced block is one of:

* **not code**: ``text`` (a sample of output, a formula), ``mermaid`` or no language (a picture);
* **data**: ``json``, ``toml``, ``yaml``: it parses, and a YAML plan, goal or fragment of steps is
  validated as such (``tests/unit/test_docs_blocks.py``);
* **a program**: ``python``, ``bash``, ``console`` (its ``$`` lines are the commands, the others
  what they print): it runs (``tests/unit/test_docs_blocks.py`` for Python that needs nothing,
  ``tests/e2e/test_docs.py`` for the shell and for what needs a deployment).

A block that cannot run as written says why, reviewed, in an HTML comment on the line before its
fence: ``<!-- not-run: REASON -->``. A Python block that needs a running deployment says so the
same way, ``<!-- run: deployed -->``: the page's blocks then run on one deployment of its own.
A block another test already runs with its own checks names it, ``<!-- run: by tests/PATH.py,
... -->`` (the file must exist and name the page). Any other block runs; a block of a language not
named here is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

NOT_CODE = frozenset({"text", "mermaid", ""})
DATA = frozenset({"json", "toml", "yaml"})
PROGRAMS = frozenset({"python", "bash", "console"})

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*(not-run|run):\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, first line, language, text and marker (``not_run``: the
    reason it does not run; ``deployed``: it runs on the page's deployment; ``run_by``: the test
    that runs it)."""

    page: Path
    line: int
    language: str
    text: str
    not_run: str = ""
    deployed: bool = False
    run_by: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the docs runner runs (or parses) it."""
        return self.language not in NOT_CODE and not self.not_run and not self.run_by


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order, with their markers (an unknown marker is kept in
    ``run_by``/``not_run`` as written, for the checks to refuse)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = _MARKER.fullmatch(before)
        kind, said = marker.groups() if marker else ("", "")
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group(1),
                text=match.group(2),
                not_run=said if kind == "not-run" else "",
                deployed=kind == "run" and said == "deployed",
                run_by=said.removeprefix("by ").split(",")[0]
                if kind == "run" and said != "deployed"
                else "",
            )
        )
    return found


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def console_commands(text: str) -> str:
    """A ``console`` block's commands (its ``$`` lines, with their ``\\`` continuations) as a
    script."""
    commands: list[str] = []
    going_on = False
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif going_on:
            commands.append(line)
        else:
            continue
        going_on = line.endswith("\\")
    return "\n".join(commands) + "\n"


def token_recipe() -> str:
    """The token recipe of ``docs/security.md``: its Python block that defines
    ``operator_token``."""
    [found] = [
        b.text
        for b in blocks(DOCS / "security.md")
        if b.language == "python" and "def operator_token(" in b.text
    ]
    return found
