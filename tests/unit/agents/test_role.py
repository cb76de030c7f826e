"""The built-in role classes differ only in their data (``RoleSpec``), plus their own options."""

from __future__ import annotations

import pytest

from stratagem.agents import ROLE_TYPES, TacticalAgent, WorldModel, build_agent
from stratagem.agents._perception import perception_tools
from stratagem.agents._role import RoleAgent
from stratagem.agents._tactical import TacticalPlanner
from stratagem.agents.research import RESEARCH_TOOLS
from stratagem.protocol import ROLES


@pytest.mark.parametrize("role", ROLES)
def test_each_role_agent_is_built_from_its_spec(role: str) -> None:
    agent_type = ROLE_TYPES[role]
    assert isinstance(agent_type, type)
    assert issubclass(agent_type, RoleAgent)
    spec = agent_type.spec
    agent = build_agent(role, entry_points=False)
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
