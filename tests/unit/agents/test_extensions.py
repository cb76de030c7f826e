"""Extensions: loading by module, module:function, file and entry point; the word_count example."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

import stratagem.agents._extensions as extensions_module
from stratagem.agents import (
    ENTRY_POINT_GROUP,
    Agent,
    ExtensionError,
    PerceptionAgent,
    StrategicAgent,
    build_agent,
    build_in_memory,
    load_extensions,
)
from stratagem.protocol import CAPABILITIES, WireModel
from tests.unit.agents.conftest import REPO, call

pytestmark = pytest.mark.usefixtures("clean_registry")

WORD_COUNT = "examples.extensions.word_count"
TEXT = "Mira waits in the courtyard. Mira wants the crown, and the crown waits."


def explode(agent: Agent) -> None:
    """An extension whose setup fails."""
    raise RuntimeError(f"no room on the {agent.role} agent")


def mark(agent: Agent) -> None:
    """An extension function that leaves a mark."""
    agent.registry.register(agent.registry.get("measure_tension"), replace=True)
    MARKED.append(agent.role)


MARKED: list[str] = []


async def count(agent: Agent, text: str) -> WireModel:
    request = CAPABILITIES["CountWords"].request.model_validate({"text": text, "top": 2})
    return await agent.handle("CountWords", request, call("CountWords", agent.role))


def _without_repo(path: list[str]) -> list[str]:
    return [p for p in path if Path(p or ".").resolve() != REPO]


async def test_word_count_by_module_name_from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    # As a user runs it: from a checkout that is not on the import path.
    monkeypatch.setattr(sys, "path", _without_repo(sys.path))
    monkeypatch.chdir(REPO)
    agent = StrategicAgent()
    assert load_extensions([WORD_COUNT], agent, entry_points=False) == [WORD_COUNT]
    assert "count_words" in agent.registry
    assert "CountWords" in agent.capabilities
    answer = await count(agent, TEXT)
    assert answer.model_dump() == {"words": 13, "distinct": 8, "most_common": ["the", "mira"]}
    card = agent.card()
    assert "CountWords" in [c.name for c in card.capabilities]
    assert "count_words" in card.tools
    schema = json.loads(next(c for c in card.capabilities if c.name == "CountWords").request_schema)
    assert set(schema["properties"]) == {"text", "top"}
    [snapshot] = agent.plans("")
    assert snapshot.status == "succeeded"


async def test_word_count_leaves_other_roles_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    agents, _ = build_in_memory(extensions=[WORD_COUNT], entry_points=False)
    assert "count_words" in agents["strategic"].registry
    for role in ("perception", "tactical", "orchestrator"):
        assert "count_words" not in agents[role].registry
        assert "CountWords" not in agents[role].capabilities


async def test_word_count_by_file_path() -> None:
    agent = build_agent(
        "strategic",
        extensions=[str(REPO / "examples" / "extensions" / "word_count.py")],
        entry_points=False,
    )
    answer = await count(agent, "one two two")
    assert answer.model_dump() == {"words": 3, "distinct": 2, "most_common": ["two", "one"]}


def test_module_function_names_call_that_function() -> None:
    MARKED.clear()
    load_extensions([f"{__name__}:mark"], StrategicAgent(), entry_points=False)
    assert MARKED == ["strategic"]


def test_entry_points_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    points = [
        importlib.metadata.EntryPoint(name="words", value=WORD_COUNT, group=ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint(
            name="mark", value=f"{__name__}:mark", group=ENTRY_POINT_GROUP
        ),
    ]
    seen: list[str] = []

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        seen.append(group)
        return points

    monkeypatch.setattr(extensions_module.importlib.metadata, "entry_points", entry_points)
    MARKED.clear()
    agent = StrategicAgent()
    loaded = load_extensions([], agent)
    assert seen == [ENTRY_POINT_GROUP]
    assert loaded == [
        f"entry point mark ({__name__}:mark)",
        f"entry point words ({WORD_COUNT})",
    ]
    assert "count_words" in agent.registry
    assert MARKED == ["strategic"]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("no_such_extension_module", "cannot import module 'no_such_extension_module'"),
        ("json", "the module has no setup(agent) function"),
        ("json:nope", "the module has no attribute 'nope'"),
        ("missing/extension.py", "no such file: missing/extension.py"),
        (f"{__name__}:explode", "setup failed on the perception agent: RuntimeError: no room"),
        (":setup", "expected 'module', 'module:function' or 'file.py'"),
    ],
)
def test_a_broken_extension_is_a_clear_error_naming_it(name: str, fragment: str) -> None:
    with pytest.raises(ExtensionError) as info:
        load_extensions([name], PerceptionAgent(), entry_points=False)
    assert info.value.name == name
    assert str(info.value).startswith(f"extension {name!r}: ")
    assert fragment in str(info.value)


def test_build_agent_refuses_unknown_roles() -> None:
    with pytest.raises(ValueError, match="unknown role 'narrator'"):
        build_agent("narrator")
