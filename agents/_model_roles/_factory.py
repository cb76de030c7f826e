"""``model_planner``: the right model planner for an agent."""

from __future__ import annotations

from typing import Any

from stratagem.agents._agent import Agent
from stratagem.agents._model import ModelClient
from stratagem.agents._model_planner import ModelPlanner, ModelPlanningConfig, PlanJudge
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

# Each built-in planner, the model planner that takes its place, and the judge of its answers.
_MODEL_PLANNERS: tuple[tuple[type, type[ModelPlanner], PlanJudge | None], ...] = (
    (PerceptionPlanner, PerceptionModelPlanner, None),
    (TacticalPlanner, TacticalModelPlanner, simulate_judge),
    (StrategicPlanner, StrategicModelPlanner, arc_judge),
    (OrchestratorPlanner, OrchestratorModelPlanner, None),
)


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
    for planner_type, model_type, judge in _MODEL_PLANNERS:
        if isinstance(agent.planner, planner_type):
            return model_type(
                role=agent.role,
                plan_type=agent.plan_type,
                registry=agent.registry,
                client=client,
                deterministic=deterministic,
                config=config,
                judge=judge,
                budget=budget,
            )
    return None
