"""Building an agent by role name: a built-in role, or one an extension defines.

``ROLE_TYPES`` is the table of the built-in roles: each name's ``AgentRole`` (its ``RoleSpec`` and
the function that builds one ``Agent`` of it with the role's own options).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, Protocol

from opentelemetry.trace import TracerProvider

from stratagem.agents._agent import Agent
from stratagem.agents._definition import defined_agent_type
from stratagem.agents._extensions import extension_setups, set_up
from stratagem.agents._in_memory import serve_in_memory
from stratagem.agents._orchestrator import OrchestratorAgent
from stratagem.agents._perception import PerceptionAgent
from stratagem.agents._strategic import StrategicAgent
from stratagem.agents._tactical import TacticalAgent
from stratagem.agents._world import WorldStore
from stratagem.planning import Dispatcher, EngineConfig, InMemoryDispatcher, StateStore
from stratagem.protocol import roles as known_roles

__all__ = ["ROLE_TYPES", "RoleAgentType", "build_agent", "build_in_memory"]


class RoleAgentType(Protocol):
    """How a role's agent is built (each built-in ``AgentRole`` and each defined one matches it)."""

    def __call__(
        self,
        *,
        dispatcher: Dispatcher | None = ...,
        engine_config: EngineConfig | None = ...,
        tracer_provider: TracerProvider | None = ...,
        store: StateStore | None = ...,
    ) -> Agent:
        """Build the agent."""
        ...


ROLE_TYPES: Final[Mapping[str, RoleAgentType]] = MappingProxyType(
    {
        "perception": PerceptionAgent,
        "strategic": StrategicAgent,
        "tactical": TacticalAgent,
        "orchestrator": OrchestratorAgent,
    }
)
"""The ``AgentRole`` of each built-in role (``define_agent`` adds roles beside them)."""


def build_agent(
    role: str,
    *,
    dispatcher: Dispatcher | None = None,
    engine_config: EngineConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    extensions: Sequence[str] = (),
    entry_points: bool = True,
    store: StateStore | None = None,
    world_store: WorldStore | None = None,
    a2a_agents: Collection[str] = (),
) -> Agent:
    """Build the agent of a role and load extensions into it.

    The extensions are imported first, so ``role`` may be one an extension defines.

    Args:
        role: ``"perception"``, ``"strategic"``, ``"tactical"``, ``"orchestrator"``, or the role of
            an agent an extension defines (``define_agent``).
        dispatcher: Sends its cross-agent steps.
        engine_config: The engine's limits and seed.
        tracer_provider: Where its spans go.
        extensions: Extensions to load (``module``, ``module:function`` or ``file.py``).
        entry_points: Also load the ``stratagem.extensions`` entry points.
        store: Where its engine keeps plans durably (``None``: nothing is kept, no resume).
        world_store: Where the perception agent keeps its world across restarts (other roles
            keep no world).
        a2a_agents: The external A2A agents the orchestrator's goals may consult, by name (its
            ``dispatcher`` must reach them; other roles ignore it).

    Returns:
        The agent.

    Raises:
        ValueError: The role is neither a built-in one nor one the extensions define.
        ExtensionError: An extension failed to load (or defines an agent badly).
    """
    setups = extension_setups(extensions, entry_points=entry_points)
    agent_type: RoleAgentType | None = ROLE_TYPES.get(role) or defined_agent_type(role)
    if agent_type is None:
        raise ValueError(f"unknown role {role!r}; roles are: {', '.join(known_roles())}")
    # A role's own options, for the roles that take them.
    if agent_type is PerceptionAgent:
        agent = PerceptionAgent(
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            store=store,
            world_store=world_store,
        )
    elif agent_type is OrchestratorAgent:
        agent = OrchestratorAgent(
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            store=store,
            a2a_agents=a2a_agents,
        )
    else:
        agent = agent_type(
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            store=store,
        )
    set_up(agent, setups)
    return agent


def build_in_memory(
    roles: Iterable[str] | None = None,
    *,
    engine_config: EngineConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    extensions: Sequence[str] = (),
    entry_points: bool = True,
) -> tuple[dict[str, Agent], InMemoryDispatcher]:
    """Build agents that reach each other in this process through one ``InMemoryDispatcher``.

    Each cross-agent step calls the target agent's ``handle`` directly (no wire, no policy, no
    audit): for tests, notebooks and single-process use.

    Args:
        roles: The roles to build (by default every one: the built-in four, then those the
            extensions define).
        engine_config: Every engine's limits and seed.
        tracer_provider: Where spans go.
        extensions: Extensions loaded into every agent.
        entry_points: Also load the ``stratagem.extensions`` entry points.

    Returns:
        The agents by role, and the dispatcher that connects them.
    """
    if roles is None:
        extension_setups(extensions, entry_points=entry_points)  # the agents they define
        roles = known_roles()
    dispatcher = InMemoryDispatcher()
    agents = {
        role: build_agent(
            role,
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            extensions=extensions,
            entry_points=entry_points,
        )
        for role in roles
    }
    serve_in_memory(dispatcher, agents.values())
    return agents, dispatcher
