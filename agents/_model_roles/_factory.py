"""``model_planner``: the right model planner for an agent."""

from __future__ import annotations

from typing import Any

from stratagem.agents._agent import Agent
from stratagem.agents._model import ModelClient
from stratagem.agents._model_planner import ModelPlanner, ModelPlanningConfig
from stratagem.agents._model_roles._orchestrator import OrchestratorModelPlanner
from stratagem.agents._model_roles._perception import PerceptionModelPlanner
from stratagem.agents._model_roles._strategic import StrategicModelPlanner, arc_judge
from stratagem.agents._model_roles._tactical import TacticalModelPlanner, simulate_judge
from stratagem.agents._orchestrator import (
    OrchestratorPlanner,
)
from stratagem.agents._perception import (
    PerceptionPlanner,
)
from stratagem.agents._strategic import (
    StrategicPlanner,
)
from stratagem.agents._tactical import TacticalPlanner
from stratagem.planning import Budget


def model_planner(
    agent: Agent,
    client: ModelClient,
    config: ModelPlanningConfig | None = None,
    *,
    budget: Budget | None = None,
) -> ModelPlanner | None:
    """The model planner for ``agent``'s built-in capabilities (its own planner the fallback);
    ``None`` for an agent whose planner is none of the four built-in ones."""
    deterministic: Any = agent.planner
    if isinstance(agent.planner, PerceptionPlanner):
        return PerceptionModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            budget=budget,
        )
    if isinstance(agent.planner, TacticalPlanner):
        return TacticalModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            judge=simulate_judge,
            budget=budget,
        )
    if isinstance(agent.planner, StrategicPlanner):
        return StrategicModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            judge=arc_judge,
            budget=budget,
        )
    if isinstance(agent.planner, OrchestratorPlanner):
        return OrchestratorModelPlanner(
            role=agent.role,
            plan_type=agent.plan_type,
            registry=agent.registry,
            client=client,
            deterministic=deterministic,
            config=config,
            budget=budget,
        )
    return None
