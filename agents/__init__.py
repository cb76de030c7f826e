"""Tools, registries, the one ``Agent`` and the four built-in roles (data that builds it).

The public names are re-exported here; the ``_module.py`` files are private. ``docs/internals.md``
describes how they fit the layers around this one.
"""

from typing import TYPE_CHECKING

from stratagem.agents._agent import Agent, Planner, PlanRecord
from stratagem.agents._artifacts import (
    ARTIFACT_TARGET,
    artifact_grants,
    artifact_tools,
    attach_artifact_tools,
)
from stratagem.agents._definition import (
    AgentSpec,
    define_agent,
    defined_agents,
    extension_policy_rules,
)
from stratagem.agents._demo import DEMO_GOAL
from stratagem.agents._errors import AgentDefinitionError, AgentError, ExtensionError
from stratagem.agents._extensions import (
    ENTRY_POINT_GROUP,
    Extension,
    import_extensions,
    load_extensions,
)
from stratagem.agents._extract import (
    DEFAULT_PATTERNS,
    ExtractionPattern,
    Mention,
    ResolutionStrategy,
    slugify,
)
from stratagem.agents._in_memory import serve_in_memory
from stratagem.agents._memory import (
    Embedder,
    EmbeddingError,
    InMemoryMemoryStore,
    MemoryDeniedError,
    MemoryInputError,
    MemoryItem,
    MemoryLimits,
    MemoryStore,
    Namespace,
    OpenAIEmbedder,
    PolicedMemory,
    SqliteMemoryStore,
    format_namespace,
    memory_tools,
    parse_namespace,
)
from stratagem.agents._model import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ModelClient,
    ModelConfig,
    OpenAIModelClient,
    ScriptedModelClient,
    parse_json_answer,
    response_format,
)
from stratagem.agents._model_limit import (
    LocalModelLimiter,
    ModelLimiter,
    ModelTurn,
    TurnTimeoutError,
    shared_limiter,
)
from stratagem.agents._model_planner import (
    ModelPlanner,
    ModelPlanningConfig,
    PlanJudge,
    plan_answer_schema,
    rederive,
)
from stratagem.agents._model_roles import (
    OrchestratorModelPlanner,
    PerceptionModelPlanner,
    StrategicModelPlanner,
    TacticalModelPlanner,
    model_planner,
)
from stratagem.agents._model_trace import TracedModelClient
from stratagem.agents._narrative import THEME_LEXICONS, ArcChoice
from stratagem.agents._orchestrator import (
    Assignment,
    OrchestrationPlan,
    OrchestratorAgent,
    OrchestratorPlanner,
)
from stratagem.agents._perception import (
    PerceptionAgent,
    PerceptionPlan,
    PerceptionPlanner,
    StateUpdate,
)
from stratagem.agents._role import AgentRole, RoleAgent, RoleSpec
from stratagem.agents._roles import ROLE_TYPES, RoleAgentType, build_agent, build_in_memory
from stratagem.agents._strategic import (
    DramaticBeat,
    NarrativeGoal,
    StrategicAgent,
    StrategicPlan,
    StrategicPlanner,
)
from stratagem.agents._tactical import (
    ResourceRequirements,
    TacticalAgent,
    TacticalPlan,
    TacticalPlanner,
    TacticalStep,
)
from stratagem.agents._tool import Tool, ToolRegistry, in_thread, tool
from stratagem.agents._wire import gate_info
from stratagem.agents._world import FileWorldStore, WorldModel, WorldStore
from stratagem.protocol._lazy import lazy_exports

if TYPE_CHECKING:
    from stratagem.agents._mcp import (
        JsonSchemaModel,
        McpLoadError,
        McpResult,
        McpToolset,
        json_schema_model,
        tool_effects,
    )
    from stratagem.agents._memory._postgres import PostgresMemoryStore
    from stratagem.agents._world._postgres import PostgresWorldStore

# Imported on first use: the PostgreSQL world store needs psycopg (the `postgres` extra); the MCP
# client needs the mcp SDK, httpx2 and jsonschema, which only an agent with MCP servers uses.
__getattr__ = lazy_exports(
    __name__,
    {
        "PostgresMemoryStore": "._memory._postgres",
        "PostgresWorldStore": "._world._postgres",
        **dict.fromkeys(
            (
                "JsonSchemaModel",
                "McpLoadError",
                "McpResult",
                "McpToolset",
                "json_schema_model",
                "tool_effects",
            ),
            "._mcp",
        ),
    },
)

__all__ = [
    "ARTIFACT_TARGET",
    "DEFAULT_PATTERNS",
    "DEMO_GOAL",
    "ENTRY_POINT_GROUP",
    "ROLE_TYPES",
    "THEME_LEXICONS",
    "Agent",
    "AgentDefinitionError",
    "AgentError",
    "AgentRole",
    "AgentSpec",
    "ArcChoice",
    "Assignment",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "DramaticBeat",
    "Embedder",
    "EmbeddingError",
    "Extension",
    "ExtensionError",
    "ExtractionPattern",
    "FileWorldStore",
    "InMemoryMemoryStore",
    "JsonSchemaModel",
    "LocalModelLimiter",
    "McpLoadError",
    "McpResult",
    "McpToolset",
    "MemoryDeniedError",
    "MemoryInputError",
    "MemoryItem",
    "MemoryLimits",
    "MemoryStore",
    "Mention",
    "ModelClient",
    "ModelConfig",
    "ModelLimiter",
    "ModelPlanner",
    "ModelPlanningConfig",
    "ModelTurn",
    "Namespace",
    "NarrativeGoal",
    "OpenAIEmbedder",
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
    "PolicedMemory",
    "PostgresMemoryStore",
    "PostgresWorldStore",
    "ResolutionStrategy",
    "ResourceRequirements",
    "RoleAgent",
    "RoleAgentType",
    "RoleSpec",
    "ScriptedModelClient",
    "SqliteMemoryStore",
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
    "TurnTimeoutError",
    "WorldModel",
    "WorldStore",
    "artifact_grants",
    "artifact_tools",
    "attach_artifact_tools",
    "build_agent",
    "build_in_memory",
    "define_agent",
    "defined_agents",
    "extension_policy_rules",
    "format_namespace",
    "gate_info",
    "import_extensions",
    "in_thread",
    "json_schema_model",
    "load_extensions",
    "memory_tools",
    "model_planner",
    "parse_json_answer",
    "parse_namespace",
    "plan_answer_schema",
    "rederive",
    "response_format",
    "serve_in_memory",
    "shared_limiter",
    "slugify",
    "tool",
    "tool_effects",
]
