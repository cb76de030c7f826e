"""``model_planner``: the right model planner for an agent."""

from __future__ import annotations

from typing import Any

from stratagem.agents._agent import Agent
from stratagem.agents._goals._model import use_goal_model
from stratagem.agents._model import ModelClient
from stratagem.agents._model_answer import ModelAnswer
from stratagem.agents._model_planner import ModelPlanner, ModelPlanningConfig
from stratagem.agents._model_roles._orchestrator import ORCHESTRATOR_ANSWER
from stratagem.agents._model_roles._perception import PERCEPTION_ANSWER
from stratagem.agents._model_roles._strategic import STRATEGIC_ANSWER
from stratagem.agents._model_roles._tactical import TACTICAL_ANSWER
from stratagem.agents._orchestrator import OrchestratorPlanner
from stratagem.agents._perception import PerceptionPlanner
from stratagem.agents._strategic import StrategicPlanner
from stratagem.agents._tactical import TacticalPlanner
from stratagem.planning import Budget

# Each built-in planner, and the answer its model planner asks the model for.
_ANSWERS: tuple[tuple[type, ModelAnswer[Any]], ...] = (
    (PerceptionPlanner, PERCEPTION_ANSWER),
    (TacticalPlanner, TACTICAL_ANSWER),
    (StrategicPlanner, STRATEGIC_ANSWER),
    (OrchestratorPlanner, ORCHESTRATOR_ANSWER),
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
    for planner_type, answer in _ANSWERS:
        if isinstance(agent.planner, planner_type):
            planner = ModelPlanner(
                role=agent.role,
                plan_type=agent.plan_type,
                registry=agent.registry,
                client=client,
                deterministic=deterministic,
                config=config,
                budget=budget,
                answer=answer,
            )
            use_goal_model(agent, planner)  # the orchestrator's AskGoal: agents/_goals/_model.py
            return planner
    return None
