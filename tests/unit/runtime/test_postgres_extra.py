"""PostgreSQL support is an extra: everything else works without psycopg, and a PostgreSQL URL
without it is one line naming the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import stratagem.planning
import stratagem.protocol

# Makes psycopg and psycopg_pool unimportable in the child, as in an install without the extra.
BLOCK = """
import sys
class _NoPsycopg:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("psycopg", "psycopg_pool"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoPsycopg())
"""
# The importlib.util.find_spec the settings use consults sys.meta_path too.


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "STRATAGEM_STATE_DIR": str(tmp_path), **env},
    )


def test_the_packages_import_without_psycopg(tmp_path: Path) -> None:
    result = _python(
        "import stratagem.planning, stratagem.protocol, stratagem.agents\n"
        "import stratagem.runtime.config._stores, stratagem.runtime.config._settings\n"
        "print('psycopg' in sys.modules)",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_postgresql_url_without_psycopg_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    result = _python(
        "from stratagem.runtime._cli import main\n"
        "sys.argv = ['stratagem', 'audit', 'verify']\n"
        "main()",
        tmp_path,
        STRATAGEM_STORE_URL="postgresql://stratagem@127.0.0.1:1/stratagem",
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "stratagem[postgres]" in lines[0]
    assert "psycopg" in lines[0]


@pytest.mark.parametrize(
    ("package", "name"),
    [
        (stratagem.planning, "PostgresStateStore"),
        (stratagem.protocol, "PostgresAnswerStore"),
        (stratagem.protocol, "PostgresAuditLog"),
    ],
)
def test_the_postgres_classes_are_still_public_names(package: object, name: str) -> None:
    assert name in package.__all__  # type: ignore[attr-defined]
    assert getattr(package, name).__name__ == name


def test_an_unknown_attribute_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = stratagem.planning.NoSuchThing  # type: ignore[attr-defined]
