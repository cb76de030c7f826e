"""An agent actor's memory wiring (``runtime.host._memory``): the tools the policy grants, and no
store opened for an agent it grants nothing."""

from __future__ import annotations

from pathlib import Path

from stratagem.agents import StrategicAgent
from stratagem.protocol import InMemoryAuditLog, Policy
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.host._memory import attach_memory

OWN = Policy.from_toml(
    '[[memory]]\ncaller = "*"\nnamespaces = ["agent/{caller}"]\naccess = ["read", "write"]\n'
)


async def test_an_agent_the_policy_grants_gets_the_tools_and_the_deployments_store(
    tmp_path: Path,
) -> None:
    agent = StrategicAgent()
    store = await attach_memory(agent, load_settings(state_dir=tmp_path), OWN, InMemoryAuditLog())
    assert store is not None
    try:
        assert {"memory.put", "memory.get", "memory.search"} <= set(agent.registry.names())
        assert (tmp_path / "memory.sqlite3").is_file()
    finally:
        await store.aclose()


async def test_the_shipped_policy_gives_an_agent_no_tools_and_opens_nothing(
    tmp_path: Path,
) -> None:
    agent = StrategicAgent()
    before = set(agent.registry.names())
    store = await attach_memory(agent, load_settings(state_dir=tmp_path), Policy.default(), None)
    assert store is None
    assert set(agent.registry.names()) == before
    assert not (tmp_path / "memory.sqlite3").exists()
