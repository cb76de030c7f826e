"""Checks that keep the architecture honest: import direction and fresh generated code."""

from __future__ import annotations

import filecmp
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_import_contracts_hold() -> None:
    result = subprocess.run(
        [str(BIN / "lint-imports")], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_generated_protobuf_code_is_fresh(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_protos.sh"), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    fresh = tmp_path / "protocol" / "_gen"
    committed = REPO / "protocol" / "_gen"
    fresh_files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    committed_files = sorted(
        p.relative_to(committed)
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh_files == committed_files, "run `make proto`: generated files differ"
    stale = [
        str(p) for p in fresh_files if not filecmp.cmp(fresh / p, committed / p, shallow=False)
    ]
    assert not stale, f"run `make proto`: stale generated files {stale}"


def test_ray_is_not_imported_by_lower_layers() -> None:
    # A process that imports every lower layer must not have loaded Ray.
    code = (
        "import sys, stratagem.protocol, stratagem.planning, stratagem.agents; "
        "print('ray' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


APPRAISAL = REPO / "examples" / "extensions" / "appraisal"


def test_the_examples_generated_code_is_not_stale(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{APPRAISAL}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", str(APPRAISAL / "appraisal.proto")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    for name in ("appraisal_pb2.py", "appraisal_pb2.pyi"):
        assert (tmp_path / name).read_text() == (APPRAISAL / name).read_text(), (
            f"examples/extensions/appraisal/{name} is stale: regenerate it (see wire_values.py)"
        )


def test_every_package_folder_is_installed() -> None:
    # pyproject lists the packages one by one (each layer folder maps to stratagem.<layer>): a
    # subpackage missing there imports from the editable checkout but not from a wheel.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(("stratagem", *init.parent.relative_to(REPO).parts))
        for layer in ("agents", "planning", "protocol", "runtime")
        for init in (REPO / layer).rglob("__init__.py")
    }
    # Besides them, folders of package data (no Python in them) inside an installed package.
    data = {
        name
        for name in config["packages"]
        if name not in found
        and (folder := REPO.joinpath(*name.split(".")[1:])).is_dir()
        and not any(folder.glob("*.py"))
        and name.rpartition(".")[0] in config["packages"]
    }
    assert sorted(found | data) == sorted(config["packages"])
