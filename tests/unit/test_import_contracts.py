"""Each import contract in pyproject.toml fails on a violation planted for it.

The packages' Python files are copied into a scratch ``stratagem`` folder, which shadows the
editable install on ``PYTHONPATH``; one import that breaks the contract is planted there (a new
module, or a line added to one), and ``lint-imports`` is run on the copy with this repository's
contracts: the contract must be reported broken. Every contract needs its plant here, so a new
contract is shown to bite before it is trusted (``test_architecture.py`` checks they all hold on
the real tree).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("agents", "planning", "protocol", "runtime")

# Contract name -> (file under the scratch stratagem/ folder, the import planted in it). A file
# that exists gets the line appended; a new one is a module of its own.
PLANTS: dict[str, tuple[str, str]] = {
    "Layers point one way: protocol <- planning <- agents <- runtime": (
        "protocol/_planted.py",
        "import stratagem.agents",
    ),
    "runtime/ by program: the CLI over the console over the operator and the host, over "
    "telemetry and config": ("runtime/operator/_planted.py", "import stratagem.runtime._console"),
    "The operator side never imports Ray nor the host": (
        "runtime/operator/_planted.py",
        "import stratagem.runtime.host._directory",
    ),
    "The operator's parts never import its composition root": (
        "runtime/operator/_new_noun.py",  # a part module added later is covered too
        "import stratagem.runtime.operator._operator",
    ),
    "What the CLI reads to register its commands imports nothing heavy": (
        "runtime/operator/_control_verbs.py",
        "import stratagem.protocol",
    ),
    "runtime/ packages have no import cycles": (
        "runtime/telemetry/_planted.py",
        "import stratagem.runtime._console",
    ),
    "Ray is imported only under runtime/": ("agents/_planted.py", "import ray"),
    "gRPC servers and channels only in protocol/ and runtime/": (
        "planning/_planted.py",
        "import grpc",
    ),
    "Only the codec and the wire adapters touch generated protobuf code": (
        "runtime/host/_planted.py",
        "import stratagem.protocol._gen",
    ),
    "protocol/, planning/ and agents/ have no import cycles among siblings": (
        "protocol/_capabilities.py",  # _policy imports _capabilities: this closes the cycle
        "import stratagem.protocol._policy",
    ),
}


def _contracts() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [c["name"] for c in config["tool"]["importlinter"]["contracts"]]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages' Python files under ``ROOT/stratagem`` and the contracts in ``ROOT``."""
    root = tmp_path_factory.mktemp("contracts")

    def not_python(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if not n.endswith(".py") and not Path(folder, n).is_dir()]

    for package in PACKAGES:
        shutil.copytree(REPO / package, root / "stratagem" / package, ignore=not_python)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _verdicts(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    flat = " ".join(result.stdout.split())  # long names wrap in its report
    verdicts = {}
    for name in _contracts():
        found = re.search(re.escape(name) + r" (KEPT|BROKEN)", flat)
        assert found, f"no verdict for {name!r} in: {result.stdout[-2000:]}{result.stderr}"
        verdicts[name] = found.group(1)
    return verdicts


def test_every_contract_has_a_plant() -> None:
    assert sorted(PLANTS) == sorted(_contracts())


def test_the_scratch_copy_keeps_every_contract(scratch: Path) -> None:
    verdicts = _verdicts(scratch)
    assert set(verdicts.values()) == {"KEPT"}, verdicts


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_each_contract_fails_on_its_planted_violation(scratch: Path, contract: str) -> None:
    where, line = PLANTS[contract]
    path = scratch / "stratagem" / where
    before = path.read_text() if path.exists() else None
    path.write_text((before or "") + f"\n{line}  # planted\n")
    try:
        verdicts = _verdicts(scratch)
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
    assert verdicts[contract] == "BROKEN", f"{line!r} in {where} did not break {contract!r}"
