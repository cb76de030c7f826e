"""How fast the command line answers: ``stratagem --help`` and ``stratagem request`` against a
running local deployment (``stratagem up`` in a temporary state directory), wall time of the
whole process, as a user sees it. Targets: ``--help`` ≤ 0.3 s, ``request`` ≤ 0.5 s (medians)."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from tests.bench.stats import summarize

__all__ = ["HELP_TARGET_S", "REQUEST_TARGET_S", "run_cli_benchmark", "summarize_cli"]

logger = logging.getLogger(__name__)

STRATAGEM: Final = str(Path(sys.executable).parent / "stratagem")
HELP_TARGET_S: Final = 0.3
REQUEST_TARGET_S: Final = 0.5
PAYLOAD: Final = json.dumps({"text": "Mira waits in the courtyard."})


def _timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [STRATAGEM, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(
            f"stratagem {args[0]} exited {result.returncode}: {result.stderr[-500:]}"
        )
    return elapsed


def run_cli_benchmark(runs: int = 15) -> dict[str, Any]:
    """Deploy locally, time ``runs`` of each command (after one untimed run), remove the
    deployment."""
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as state_dir:
        env = dict(os.environ, STRATAGEM_STATE_DIR=state_dir)
        env.pop("RAY_ADDRESS", None)
        # As an installed package runs: with Python's bytecode cache (the untimed first run of
        # each command writes it where an editable install lacks it). Some machines set
        # PYTHONDONTWRITEBYTECODE for everything, which makes every start compile the sources.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        logger.info("cli: stratagem up in %s", state_dir)
        up = subprocess.run(
            [STRATAGEM, "up", "--json"], capture_output=True, text=True, env=env, timeout=300
        )
        if up.returncode != 0:
            return {"skipped": f"stratagem up failed: {up.stderr.strip()[-300:]}"}
        try:
            commands = {
                "help": ["--help"],
                "request": ["request", "perception", "ExtractEntities", "--json", PAYLOAD],
            }
            samples: dict[str, list[float]] = {name: [] for name in commands}
            for args in commands.values():
                _timed(args, env)
            for _ in range(runs):
                for name, args in commands.items():
                    samples[name].append(_timed(args, env))
        finally:
            subprocess.run(
                [STRATAGEM, "down"], capture_output=True, text=True, env=env, timeout=300
            )
    return summarize_cli(samples)


def summarize_cli(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Per command: wall-time summary (seconds) and the verdict against its target."""
    targets = {"help": HELP_TARGET_S, "request": REQUEST_TARGET_S}
    return {
        "commands": {name: summarize(values, digits=3) for name, values in samples.items()},
        "targets": [
            {
                "command": name,
                "median_s": round(statistics.median(samples[name]), 3),
                "max_s": target,
                "met": statistics.median(samples[name]) <= target,
            }
            for name, target in targets.items()
        ],
    }
