"""The console's scripts from the npm registry (htmx, its SSE extension, Mermaid), shipped with the
package but never committed: ``make`` installs them with ``npm ci`` from the pinned
``package-lock.json`` at the repository's root and copies the files the console serves into
``static/vendor/`` (``scripts/console_assets.sh``), which the wheel includes as package data.

Without them the console still serves every page (server-rendered, readable without scripts) and
says on each which files are missing and how to install them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["VENDOR", "Assets", "vendor_files"]

STATIC: Final = Path(__file__).resolve().parent / "static"
"""The console's own stylesheet and script."""
VENDOR: Final = STATIC / "vendor"
"""Where ``scripts/console_assets.sh`` puts the scripts from the npm registry."""
LIST: Final = Path(__file__).resolve().parent / "vendor.txt"
"""Each file served from ``/static/vendor/`` and where in ``node_modules`` it comes from (the
list ``scripts/console_assets.sh`` copies by)."""


def vendor_files(path: Path = LIST) -> dict[str, str]:
    """The files of ``vendor.txt``: name -> its path under ``node_modules``."""
    files: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, source = line.split()
            files[name] = source
    return files


@dataclass(frozen=True, slots=True)
class Assets:
    """Which of the vendored scripts are there.

    Attributes:
        folder: The folder they are looked up in.
        missing: The files that are not.
    """

    folder: Path
    missing: tuple[str, ...]

    @classmethod
    def find(cls, folder: Path = VENDOR) -> Assets:
        """Look the scripts up in ``folder``."""
        missing = tuple(name for name in vendor_files() if not (folder / name).is_file())
        return cls(folder, missing)

    @property
    def complete(self) -> bool:
        """Whether every script is there."""
        return not self.missing

    def problem(self) -> str:
        """What is missing and how to install it, in one line (``""`` when nothing is)."""
        if not self.missing:
            return ""
        return (
            f"the console's scripts are not installed ({', '.join(self.missing)} missing in "
            f"{self.folder}): live updates, actions without reloading and the DAG drawing are "
            "off; run 'make console-assets' (needs npm) in the repository, then restart "
            "'stratagem console'"
        )
