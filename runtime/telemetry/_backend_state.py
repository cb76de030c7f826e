"""Where ``scripts/otel_backend.sh`` records the development backend it started, and reading that
record back (``runtime.telemetry._backend`` finds and reads the backend;
``runtime.telemetry._export`` sends spans to it). A leaf: it imports nothing of the runtime, so
neither of those two imports the other through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STATE_FILE", "BackendState", "read_backend_state"]

STATE_FILE = Path("otel-backend") / "backend.json"
"""Where, under the state directory, ``scripts/otel_backend.sh`` records the running backend."""


@dataclass(frozen=True, slots=True)
class BackendState:
    """A running development backend, as ``scripts/otel_backend.sh`` recorded it."""

    kind: str
    pid: int
    url: str
    otlp_endpoint: str
    otlp_protocol: str = "grpc"
    project: str = "default"


def read_backend_state(state_dir: Path) -> BackendState | None:
    """The backend recorded under ``state_dir`` (``None``: no readable record), running or not."""
    path = state_dir / STATE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return BackendState(**raw)
    except (OSError, ValueError, TypeError):
        return None
