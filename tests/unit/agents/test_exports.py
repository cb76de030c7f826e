"""The agents package's public names, pinned."""

from __future__ import annotations

import inspect

from stratagem import agents

EXPECTED = [
    "DEFAULT_PATTERNS",
    "DEMO_GOAL",
    "ENTRY_POINT_GROUP",
    "ROLE_TYPES",
    "THEME_LEXICONS",
    "Agent",
    "AgentDefinitionError",
    "AgentError",
    "AgentSpec",
    "ArcChoice",
    "Assignment",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "DramaticBeat",
    "Extension",
    "ExtensionError",
    "ExtractionPattern",
    "FileWorldStore",
    "JsonSchemaModel",
    "McpLoadError",
    "McpResult",
    "McpToolset",
    "Mention",
    "ModelClient",
    "ModelConfig",
    "ModelPlanner",
    "ModelPlanningConfig",
    "NarrativeGoal",
    "OpenAIModelClient",
    "OrchestrationPlan",
    "OrchestratorAgent",
    "OrchestratorModelPlanner",
    "OrchestratorPlanner",
    "PerceptionAgent",
    "PerceptionModelPlanner",
    "PerceptionPlan",
    "PerceptionPlanner",
    "PlanJudge",
    "PlanRecord",
    "Planner",
    "PostgresWorldStore",
    "ResolutionStrategy",
    "ResourceRequirements",
    "RoleAgent",
    "RoleAgentType",
    "RoleSpec",
    "ScriptedModelClient",
    "StateUpdate",
    "StrategicAgent",
    "StrategicModelPlanner",
    "StrategicPlan",
    "StrategicPlanner",
    "TacticalAgent",
    "TacticalModelPlanner",
    "TacticalPlan",
    "TacticalPlanner",
    "TacticalStep",
    "Tool",
    "ToolRegistry",
    "TracedModelClient",
    "WorldModel",
    "WorldStore",
    "build_agent",
    "build_in_memory",
    "define_agent",
    "defined_agents",
    "extension_policy_rules",
    "import_extensions",
    "in_thread",
    "json_schema_model",
    "load_extensions",
    "model_planner",
    "parse_json_answer",
    "plan_answer_schema",
    "rederive",
    "response_format",
    "serve_in_memory",
    "slugify",
    "tool",
    "tool_effects",
]


def test_all_is_pinned() -> None:
    assert agents.__all__ == EXPECTED


def test_every_name_is_importable_and_documented() -> None:
    for name in agents.__all__:
        value = getattr(agents, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{name} has no docstring"
