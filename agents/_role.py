"""The built-in roles' agents as data: a role, its plan type, its planner and its tools.

The four role classes (``PerceptionAgent``, ``StrategicAgent``, ``TacticalAgent``,
``OrchestratorAgent``) differ in what ``RoleSpec`` holds; ``RoleAgent`` builds the registry and the
agent from their class's ``spec``. A role that takes options of its own (the tactical search's node
cap, the perception agent's world, the orchestrator's A2A agents) passes its planner, tools or
``prepare`` step in; no role class overrides a method of the agent (a structure test holds them
to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from opentelemetry.trace import TracerProvider

from stratagem.agents._agent import Agent, Planner, Prepare
from stratagem.agents._tool import Tool, ToolRegistry
from stratagem.planning import Dispatcher, EngineConfig, Plan, StateStore

__all__ = ["RoleAgent", "RoleSpec"]


def _no_tools() -> list[Tool[Any, Any]]:
    return []


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What sets one built-in role's agent apart.

    Attributes:
        role: The role's name.
        plan_type: The typed plan its planner makes.
        planner: Makes the planner of the role's built-in capabilities.
        tools: Makes the tools of its registry (none by default).
    """

    role: str
    plan_type: type[Plan]
    planner: Callable[[], Planner]
    tools: Callable[[], Iterable[Tool[Any, Any]]] = _no_tools


class RoleAgent(Agent):
    """The agent of a built-in role, built from its class's ``spec``.

    Args:
        dispatcher: Sends cross-agent steps.
        engine_config: The engine's limits and seed.
        tracer_provider: Where spans go.
        store: Where its engine keeps plans durably.
        planner: Instead of ``spec.planner()`` (a role with planner options passes its own).
        tools: Instead of ``spec.tools()`` (a role whose tools share state passes its own).
        prepare: The role's step before a request is served (``Agent``'s ``prepare``).
    """

    spec: ClassVar[RoleSpec]

    def __init__(
        self,
        *,
        dispatcher: Dispatcher | None = None,
        engine_config: EngineConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        store: StateStore | None = None,
        planner: Planner | None = None,
        tools: Iterable[Tool[Any, Any]] | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        spec = self.spec
        registry = ToolRegistry(spec.role)
        for item in spec.tools() if tools is None else tools:
            registry.register(item)
        super().__init__(
            spec.role,
            registry,
            spec.plan_type,
            spec.planner() if planner is None else planner,
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            store=store,
            prepare=prepare,
        )
