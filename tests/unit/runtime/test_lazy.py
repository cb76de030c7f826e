"""One lazy-import mechanism in the runtime: ``config._lazy.load`` (``"module"`` or
``"module:attr"``), used by the package's exports, the CLI's command modules and its tiers; no
other ``importlib.import_module`` under ``runtime/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stratagem.runtime.config import _lazy
from stratagem.runtime.config._lazy import load

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"


def test_a_reference_names_a_module_or_one_of_its_attributes() -> None:
    assert load("stratagem.runtime.config._lazy") is _lazy
    assert load("stratagem.runtime.config._lazy:load") is load


@pytest.mark.parametrize("reference", ["", ":load", "stratagem.runtime.config._lazy:"])
def test_a_malformed_reference_is_one_line_naming_it(reference: str) -> None:
    with pytest.raises(ValueError, match="is not 'module' or 'module:attr'"):
        load(reference)


def test_nothing_else_in_the_runtime_imports_by_name() -> None:
    others = []
    for path in sorted(RUNTIME.rglob("*.py")):
        if path == RUNTIME / "config" / "_lazy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("import_module", "__import__"):
                others.append(f"{path.relative_to(RUNTIME)}:{node.lineno}")
    assert not others, f"import lazily through config._lazy.load: {others}"
