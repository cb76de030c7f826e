"""Fixtures for the agents' unit tests: example goals, call contexts, in-process agents."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from stratagem.agents import Agent, build_in_memory
from stratagem.planning import InMemoryDispatcher
from stratagem.protocol import CallContext, SubmitGoalRequest
from tests.unit._registry import registries_kept

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
EXAMPLE_NAMES = ("crown", "lighthouse", "orchard")


def load_goal(name: str) -> SubmitGoalRequest:
    """The example goal ``examples/<name>.yaml``."""
    raw = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text(encoding="utf-8"))
    return SubmitGoalRequest.model_validate(raw)


def call(capability: str, target: str, *, plan_id: str = "", step_id: str = "") -> CallContext:
    """A call context as the server would set it for an operator's request."""
    return CallContext(
        caller="operator",
        target=target,
        capability=capability,
        request_id=uuid.uuid4().hex,
        plan_id=plan_id,
        step_id=step_id,
    )


@pytest.fixture
def cluster() -> tuple[dict[str, Agent], InMemoryDispatcher]:
    """The four agents wired through one in-memory dispatcher, no extensions or entry points."""
    return build_in_memory(entry_points=False)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what extension tests do to the process: capabilities, roles and agents defined,
    sys.path, imported modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    with registries_kept():
        yield
