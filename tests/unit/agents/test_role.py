"""A built-in role is data (an ``AgentRole``: its ``RoleSpec`` and its build function) that
builds the one ``Agent``, with the options of its own passed in."""

from __future__ import annotations

import pytest

from stratagem.agents import (
    ROLE_TYPES,
    Agent,
    AgentRole,
    OrchestratorAgent,
    PerceptionAgent,
    StrategicAgent,
    TacticalAgent,
    WorldModel,
    build_agent,
    load_extensions,
)
from stratagem.agents._perception import perception_tools
from stratagem.agents._role import RoleAgent
from stratagem.agents._tactical import TacticalPlanner
from stratagem.agents.research import RESEARCH_TOOLS
from stratagem.protocol import ROLES


@pytest.mark.parametrize("role", ROLES)
def test_each_role_agent_is_built_from_its_spec(role: str) -> None:
    agent_type = ROLE_TYPES[role]
    assert isinstance(agent_type, AgentRole)
    spec = agent_type.spec
    agent = build_agent(role, entry_points=False)
    assert type(agent) is Agent
    assert isinstance(agent, agent_type)
    assert isinstance(agent, RoleAgent)  # the former name, kept for one release
    assert agent.role == spec.role == role
    assert agent.plan_type is spec.plan_type
    assert type(agent.planner) is type(spec.planner())
    # The perception agent's tools share its world, so it passes them in, with the research
    # tools (reading nothing until a deployment binds them).
    tools = perception_tools(WorldModel()) if role == "perception" else spec.tools()
    research = list(RESEARCH_TOOLS) if role == "perception" else []
    assert agent.registry.names() == [item.name for item in tools] + research


def test_the_tactical_node_cap_reaches_its_planner() -> None:
    planner = TacticalAgent(node_cap=7).planner
    assert isinstance(planner, TacticalPlanner)
    assert planner.node_cap == 7


def test_the_perception_world_is_the_one_its_tools_change() -> None:
    world = WorldModel()
    agent = PerceptionAgent(world)
    assert agent.world is world
    assert agent.worlds is not None
    assert agent.worlds.get("") is world


def test_only_the_perception_agent_keeps_worlds() -> None:
    strategic = StrategicAgent()
    assert strategic.worlds is None
    with pytest.raises(AttributeError, match="the strategic agent keeps no world"):
        _ = strategic.world
    assert not hasattr(OrchestratorAgent(), "world")


def test_an_option_a_role_does_not_take_is_refused() -> None:
    # The strategic role has no node cap, the tactical one no world: refused, not ignored.
    with pytest.raises(TypeError, match="node_cap"):
        StrategicAgent(node_cap=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="world_store"):
        TacticalAgent(world_store=None)  # type: ignore[call-arg]


def test_isinstance_tells_the_roles_apart() -> None:
    strategic, tactical = StrategicAgent(), TacticalAgent()
    assert isinstance(strategic, StrategicAgent)
    assert not isinstance(strategic, TacticalAgent)
    assert isinstance(tactical, TacticalAgent)
    assert not isinstance(object(), StrategicAgent)
    assert repr(StrategicAgent) == "<role strategic: StrategicAgent>"


def test_an_extension_that_tells_the_perception_agent_by_isinstance_still_finds_it() -> None:
    # examples/extensions/wire_values.py sets up ``Appraise`` on ``isinstance(agent,
    # PerceptionAgent)`` and reads ``agent.world``: an extension written for the role classes.
    perception, strategic = PerceptionAgent(), StrategicAgent()
    for agent in (perception, strategic):
        load_extensions(["examples.extensions.wire_values"], agent, entry_points=False)
    assert "appraise" in perception.registry.names()
    assert "Appraise" in perception.capabilities
    assert "appraise" not in strategic.registry.names()
