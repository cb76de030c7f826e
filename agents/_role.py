"""A role as data: its ``RoleSpec``, composed into the one ``Agent`` by an ``AgentRole``.

A role is what sets its agents apart, never a subclass of ``Agent``: its name, plan type, planner
and tools (``RoleSpec``), plus the options of its own that one agent of it takes (the tactical
search's node cap, the perception agent's world and world store, the orchestrator's A2A agents),
which its build function turns into a planner, tools, a ``prepare`` step or the worlds it keeps.
``AgentRole`` pairs a spec with that build function under the role's public name
(``PerceptionAgent``, ...): calling it builds an ``Agent``, and ``isinstance(agent,
PerceptionAgent)`` tells an agent of that role. An extension's ``define_agent`` makes an
``AgentRole`` the same way (``role_builder``). A structure test holds the package to it: no
class subclasses ``Agent`` (nor ``ModelPlanner``: a role's model answer is a ``ModelAnswer``
value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypedDict

from opentelemetry.trace import TracerProvider

from stratagem.agents._agent import Agent, Planner, Prepare
from stratagem.agents._tool import Tool, ToolRegistry
from stratagem.agents._world import Worlds
from stratagem.planning import Dispatcher, EngineConfig, Plan, StateStore

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.12

__all__ = [
    "AgentOptions",
    "AgentRole",
    "PlainBuild",
    "RoleAgent",
    "RoleSpec",
    "compose_agent",
    "role_builder",
]

P = ParamSpec("P")

RoleAgent = Agent
"""The one agent class under its former name (kept for one release): a role's agent is an
``Agent`` an ``AgentRole`` builds, no longer an instance of a class per role."""


def _no_tools() -> list[Tool[Any, Any]]:
    return []


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What sets one role's agent apart.

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


class AgentOptions(TypedDict, total=False):
    """What every role's agent takes, whatever its role (``Agent``'s arguments of those names)."""

    dispatcher: Dispatcher | None
    engine_config: EngineConfig | None
    tracer_provider: TracerProvider | None
    store: StateStore | None


def compose_agent(
    spec: RoleSpec,
    *,
    planner: Planner | None = None,
    tools: Iterable[Tool[Any, Any]] | None = None,
    prepare: Prepare | None = None,
    worlds: Worlds | None = None,
    **options: Unpack[AgentOptions],
) -> Agent:
    """The agent of ``spec``'s role: its registry of ``spec.tools()`` (or ``tools``), planned by
    ``spec.planner()`` (or ``planner``), with the role's ``prepare`` step and ``worlds``."""
    registry = ToolRegistry(spec.role)
    for item in spec.tools() if tools is None else tools:
        registry.register(item)
    return Agent(
        spec.role,
        registry,
        spec.plan_type,
        spec.planner() if planner is None else planner,
        prepare=prepare,
        worlds=worlds,
        **options,
    )


class PlainBuild(Protocol):
    """The build function of a role without options of its own (``role_builder``'s)."""

    def __call__(
        self,
        *,
        planner: Planner | None = None,
        tools: Iterable[Tool[Any, Any]] | None = None,
        prepare: Prepare | None = None,
        **options: Unpack[AgentOptions],
    ) -> Agent: ...


def role_builder(spec: RoleSpec) -> PlainBuild:
    """The build function of a role that takes no options of its own: its agent, optionally
    with another planner, other tools (sharing a store, say) or a ``prepare`` step."""

    def build(
        *,
        planner: Planner | None = None,
        tools: Iterable[Tool[Any, Any]] | None = None,
        prepare: Prepare | None = None,
        **options: Unpack[AgentOptions],
    ) -> Agent:
        return compose_agent(spec, planner=planner, tools=tools, prepare=prepare, **options)

    return build


@dataclass(frozen=True, slots=True)
class AgentRole(Generic[P]):
    """A role under its public name: its spec, and how one agent of it is built.

    Calling it builds the agent (``StrategicAgent()``, ``TacticalAgent(node_cap=7)``); it is not
    a class, but ``isinstance(agent, role)`` still says whether ``agent`` is one of its agents
    (same role, same plan type).

    Attributes:
        name: The public name (``"PerceptionAgent"``).
        spec: The role's data.
        build: The role's options (and every agent's, ``AgentOptions``) -> its agent.
    """

    name: str
    spec: RoleSpec
    build: Callable[P, Agent]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Agent:
        """Build one agent of this role."""
        return self.build(*args, **kwargs)

    def __instancecheck__(self, agent: object) -> bool:
        return (
            isinstance(agent, Agent)
            and agent.role == self.spec.role
            and agent.plan_type is self.spec.plan_type
        )

    def __repr__(self) -> str:
        return f"<role {self.spec.role}: {self.name}>"
