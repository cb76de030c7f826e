"""Agents of one's own: an extension defines a whole agent beside the four built-in ones.

A definition is data: a ``RoleSpec`` (role, plan type, planner, tools, as the built-in roles have)
plus what lets the agent be called, an ``AgentSpec``. ``define_agent`` checks it, registers its
role and capabilities with the protocol, and makes the agent's ``AgentRole`` (no class: each of its
agents is an ``Agent``, as a built-in role's is), so that ``build_agent(role)`` builds it like a
built-in one and the runtime deploys it as one more actor::

    CRITIC = define_agent(
        "critic",
        plan_type=CriticPlan,
        planner=CriticPlanner,
        tools=[parse_plan, review_steps],
        capabilities=[REVIEW_PLAN],
        callers={"orchestrator": ["ReviewPlan"]},  # who may call it, and what
        calls={},  # whom it may call, and what
    )

An extension module calls it when it is imported (it keeps the spec in a module-level name, so the
module needs no ``setup`` function). What ``callers`` and ``calls`` say becomes the policy entries
the deployment adds to its policy: no more (deny by default still holds for everything else).

A definition is refused, with nothing of it registered, when (``AgentDefinitionError``, one line):

* the role is not a lowercase identifier, is the operator's identity, a built-in role, or a role
  defined already;
* its plan type is not a ``planning.Plan`` subclass of its own (``Plan`` itself, or another
  agent's plan type);
* a tool is not a ``Tool``, two tools share a name, or a tool is another agent's (its plan type
  would then admit a tool of another agent: an agent never touches another agent's tools);
* its planner does not satisfy ``Planner``: no ``plan(capability, request, *, plan_id)`` (a plain
  or an ``async`` method) or no plain ``respond(capability, request, result)``;
* a capability is for another role, clashes with a registered one, or no ``callers`` entry lets
  anyone call it;
* a policy entry names a malformed identity or role, a capability the agent does not serve (in
  ``callers``) or one its target does not serve (in ``calls``, when the target is known).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from stratagem.agents._agent import Planner
from stratagem.agents._errors import AgentDefinitionError
from stratagem.agents._orchestrator import OrchestratorAgent
from stratagem.agents._perception import PerceptionAgent
from stratagem.agents._role import AgentRole, RoleSpec, role_builder
from stratagem.agents._strategic import StrategicAgent
from stratagem.agents._tactical import TacticalAgent
from stratagem.agents._tool import Tool
from stratagem.planning import Plan
from stratagem.protocol import (
    CAPABILITIES,
    CONTROL_ACTIONS,
    EXTENSION_FIELD,
    OPERATOR,
    READ_RPCS,
    ROLE_PATTERN,
    ROLES,
    CapabilitySpec,
    PolicyRule,
    capability_for,
    register_capability,
    register_role,
    roles,
)

__all__ = ["AgentSpec", "define_agent", "defined_agents", "extension_policy_rules"]

logger = logging.getLogger(__name__)

BUILTIN_AGENT_TYPES: Final[tuple[AgentRole[...], ...]] = (
    PerceptionAgent,
    StrategicAgent,
    TacticalAgent,
    OrchestratorAgent,
)
"""The built-in roles (``_roles.ROLE_TYPES`` maps each role's name to its ``AgentRole``)."""

ANY: Final = "*"
# Who may be named in a policy entry: an identity as tokens and certificates carry it.
_IDENTITY: Final = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_ROLE: Final = re.compile(ROLE_PATTERN)
_CAPABILITY: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
PSEUDO_CAPABILITIES: Final[frozenset[str]] = frozenset(
    {*READ_RPCS, "RunPlan", "Replay", *(f"Control.{action}" for action in CONTROL_ACTIONS)}
)
"""What the policy authorizes besides capabilities: the read RPCs, ``RunPlan``, ``Replay`` and
each ``Control.<action>``."""

_DEFINED: dict[str, AgentSpec] = {}
_TYPES: dict[str, AgentRole[...]] = {}


@dataclass(frozen=True, slots=True)
class AgentSpec(RoleSpec):
    """A whole agent an extension defines: its ``RoleSpec`` and what lets it be called.

    Attributes:
        capabilities: The capabilities it serves (registered with the protocol, carried in the
            envelope's ``extension`` body as their ``wire`` says), all planned by its planner.
        callers: Who may call it: identity (a role, ``operator``, or ``"*"``) -> the names it may
            call (its capabilities, the read RPCs such as ``Describe``, ``RunPlan``, ``Replay``,
            ``Control.<action>``, or ``"*"``).
        calls: Whom it may call: role (or ``"*"``) -> the capabilities it may call there.
        description: One line on what the agent is for.
    """

    capabilities: tuple[CapabilitySpec, ...] = ()
    callers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    calls: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    description: str = ""

    def policy_rules(self) -> tuple[PolicyRule, ...]:
        """The policy entries its ``callers`` and ``calls`` make, in that order."""
        inbound = (
            PolicyRule(caller, self.role, frozenset(names))
            for caller, names in self.callers.items()
        )
        outbound = (
            PolicyRule(self.role, target, frozenset(names)) for target, names in self.calls.items()
        )
        return (*inbound, *outbound)


def define_agent(
    role: str,
    *,
    plan_type: type[Plan],
    planner: Callable[[], Planner],
    tools: Iterable[Tool[Any, Any]] | Callable[[], Iterable[Tool[Any, Any]]] = (),
    capabilities: Iterable[CapabilitySpec] = (),
    callers: Mapping[str, Iterable[str]] | None = None,
    calls: Mapping[str, Iterable[str]] | None = None,
    description: str = "",
) -> AgentSpec:
    """Define an agent of one's own; ``build_agent(role)`` and ``stratagem up`` then make it.

    Args:
        role: Its role: a lowercase identifier no other agent has.
        plan_type: The typed plan its planner makes (a ``planning.Plan`` subclass of its own);
            its tool steps may name only ``tools``, checked as the built-in roles' plans are.
        planner: Makes its planner (a class or a function): ``plan`` (plain or ``async``) turns a
            request into a plan of ``plan_type``, ``respond`` turns the result into the response.
        tools: Its tools, or a function making them (for tools that share state).
        capabilities: What it serves.
        callers: Who may call it, and what (see ``AgentSpec.callers``); every capability must be
            granted to someone here.
        calls: Whom it may call, and what (see ``AgentSpec.calls``).
        description: One line on what it is for.

    Returns:
        The definition (keep it in a module-level name of the extension).

    Raises:
        AgentDefinitionError: The definition is refused (see the module docstring); nothing of it
            is registered.
    """
    _check_role(role)
    tool_list = _tools(role, tools)
    spec = AgentSpec(
        role=role,
        plan_type=plan_type,
        planner=planner,
        # A function making tools is called once per agent built (its tools may share state).
        tools=(lambda: tool_list) if isinstance(tools, Iterable) else tools,
        capabilities=tuple(capabilities),
        callers=_entries(role, "callers", callers),
        calls=_entries(role, "calls", calls),
        description=description,
    )
    _check_plan_type(spec)
    _check_tools(role, tool_list)
    _check_planner(spec)
    _check_capabilities(spec)
    _check_policy(spec)
    _register(spec)
    logger.info("agent %s defined (%d capabilities)", role, len(spec.capabilities))
    return spec


def defined_agents() -> Mapping[str, AgentSpec]:
    """The agents defined in this process, by role, in the order they were."""
    return MappingProxyType(_DEFINED)


def defined_agent_type(role: str) -> AgentRole[...] | None:
    """The ``AgentRole`` of the agent defined as ``role`` (``None`` when none is)."""
    return _TYPES.get(role)


def extension_policy_rules() -> list[PolicyRule]:
    """The policy entries of every agent defined in this process (added to the deployment's
    policy by the runtime)."""
    return [rule for spec in _DEFINED.values() for rule in spec.policy_rules()]


# --- checks ------------------------------------------------------------------------------------


def _refuse(role: str, reason: str) -> AgentDefinitionError:
    return AgentDefinitionError(role, reason)


def _check_role(role: str) -> None:
    if not isinstance(role, str) or not _ROLE.fullmatch(role):
        raise _refuse(
            str(role),
            "the role is not a lowercase identifier (a letter, then up to 31 letters, digits "
            "or underscores)",
        )
    if role == OPERATOR:
        raise _refuse(role, "the role is the operator's identity")
    if role in ROLES:
        raise _refuse(role, "the role is a built-in agent's; choose another name")
    if role in roles():
        raise _refuse(role, "the role is defined already (by another extension?)")


def _check_plan_type(spec: AgentSpec) -> None:
    plan_type = spec.plan_type
    if not isinstance(plan_type, type) or not issubclass(plan_type, Plan):
        raise _refuse(spec.role, f"its plan type {plan_type!r} is not a planning.Plan subclass")
    if plan_type is Plan:
        raise _refuse(spec.role, "its plan type must be a Plan subclass of its own, not Plan")
    owners = {cls.spec.plan_type: cls.spec.role for cls in BUILTIN_AGENT_TYPES} | {
        other.plan_type: other.role for other in _DEFINED.values()
    }
    if plan_type in owners:
        raise _refuse(
            spec.role,
            f"its plan type {plan_type.__name__} is the {owners[plan_type]} agent's; "
            "define a Plan subclass of its own",
        )


def _entries(
    role: str, name: str, entries: Mapping[str, Iterable[str]] | None
) -> Mapping[str, tuple[str, ...]]:
    """``callers`` or ``calls`` as a read-only mapping of tuples."""
    if entries is None:
        return MappingProxyType({})
    if not isinstance(entries, Mapping):
        raise _refuse(role, f"{name} must map names to lists of capabilities")
    for key, names in entries.items():
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise _refuse(role, f"{name}[{key!r}] must be a list of capability names")
    return MappingProxyType({key: tuple(names) for key, names in entries.items()})


def _tools(
    role: str, tools: Iterable[Tool[Any, Any]] | Callable[[], Iterable[Tool[Any, Any]]]
) -> tuple[Tool[Any, Any], ...]:
    if isinstance(tools, Iterable):
        return tuple(tools)
    try:
        return tuple(tools())
    except Exception as exc:
        raise _refuse(role, f"making its tools failed: {type(exc).__name__}: {exc}") from exc


@functools.cache
def _builtin_tools() -> Mapping[str, str]:
    """Each built-in role's tool names -> the role (read once from an agent of each)."""
    return MappingProxyType(
        {name: cls.spec.role for cls in BUILTIN_AGENT_TYPES for name in cls().registry.names()}
    )


def _check_tools(role: str, tools: tuple[Tool[Any, Any], ...]) -> None:
    others = dict(_builtin_tools())
    for other in _DEFINED.values():
        others.update((item.name, other.role) for item in other.tools())
    seen: set[str] = set()
    for item in tools:
        if not isinstance(item, Tool):
            raise _refuse(role, f"{item!r} is not a Tool (decorate the function with @tool)")
        if item.name in seen:
            raise _refuse(role, f"two of its tools are named {item.name!r}")
        seen.add(item.name)
        if item.name in others:
            raise _refuse(
                role,
                f"its plan type would admit tool {item.name!r}, which is the "
                f"{others[item.name]} agent's: an agent uses only tools of its own",
            )


def _binds(method: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    try:
        inspect.signature(method).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call decide
        return True
    return True


def _check_planner(spec: AgentSpec) -> None:
    role = spec.role
    if not callable(spec.planner):
        raise _refuse(role, "its planner must be a class or function that makes the planner")
    try:
        planner = spec.planner()
    except Exception as exc:
        raise _refuse(role, f"making its planner failed: {type(exc).__name__}: {exc}") from exc
    plan = getattr(planner, "plan", None)
    respond = getattr(planner, "respond", None)
    name = type(planner).__name__
    if not callable(plan) or not _binds(plan, "Capability", None, plan_id="p"):
        raise _refuse(
            role, f"its planner {name} has no plan(capability, request, *, plan_id) method"
        )
    if inspect.isgeneratorfunction(plan) or inspect.isasyncgenfunction(plan):
        raise _refuse(
            role,
            f"its planner {name}'s plan is a generator: it must return the plan, or be an "
            "async def whose result the agent awaits",
        )
    if not callable(respond) or not _binds(respond, "Capability", None, None):
        raise _refuse(role, f"its planner {name} has no respond(capability, request, result)")
    if inspect.iscoroutinefunction(respond) or inspect.isasyncgenfunction(respond):
        raise _refuse(
            role,
            f"its planner {name}'s respond is async: the agent calls it without awaiting "
            "(make it a plain def; plan may be async)",
        )
    replan = getattr(planner, "replan", None)
    if replan is not None and (not callable(replan) or not _binds(replan, None, None)):
        raise _refuse(role, f"its planner {name}'s replan does not take (plan, failure)")


def _check_capabilities(spec: AgentSpec) -> None:
    names: set[str] = set()
    for capability in spec.capabilities:
        if not isinstance(capability, CapabilitySpec):
            raise _refuse(spec.role, f"{capability!r} is not a protocol.CapabilitySpec")
        if capability.role != spec.role:
            raise _refuse(
                spec.role,
                f"capability {capability.name!r} is for role {capability.role!r}, not "
                f"{spec.role!r}",
            )
        if capability.field != EXTENSION_FIELD:
            raise _refuse(
                spec.role,
                f"capability {capability.name!r} must use field {EXTENSION_FIELD!r}",
            )
        if capability.name in names:
            raise _refuse(spec.role, f"capability {capability.name!r} is listed twice")
        names.add(capability.name)
        existing = CAPABILITIES.get(capability.name)
        if existing is not None and existing != capability:
            raise _refuse(
                spec.role,
                f"capability {capability.name!r} clashes with the one the {existing.role} "
                "agent serves",
            )


def _check_policy(spec: AgentSpec) -> None:
    role = spec.role
    own = {capability.name for capability in spec.capabilities}
    for caller, names in spec.callers.items():
        if caller != ANY and not (isinstance(caller, str) and _IDENTITY.fullmatch(caller)):
            raise _refuse(role, f"callers names {caller!r}, which is not an identity or '*'")
        if not names:
            raise _refuse(role, f"callers[{caller!r}] grants nothing: name what it may call")
        for name in names:
            if name != ANY and name not in own and name not in PSEUDO_CAPABILITIES:
                raise _refuse(
                    role,
                    f"callers[{caller!r}] names {name!r}, which the {role} agent does not serve",
                )
    for target, names in spec.calls.items():
        if target != ANY and not (isinstance(target, str) and _ROLE.fullmatch(target)):
            raise _refuse(role, f"calls names {target!r}, which is not a role or '*'")
        if target == role:
            raise _refuse(role, "calls names the agent itself: a plan calls its own tools")
        if not names:
            raise _refuse(role, f"calls[{target!r}] grants nothing: name what it may call")
        for name in names:
            if not isinstance(name, str) or (name != ANY and not _CAPABILITY.fullmatch(name)):
                raise _refuse(role, f"calls[{target!r}] names {name!r}, not a capability name")
            known = target != ANY and target in roles()
            if (
                known
                and name != ANY
                and name not in PSEUDO_CAPABILITIES
                and capability_for(target, name) is None
            ):
                raise _refuse(
                    role,
                    f"calls[{target!r}] names {name!r}, which the {target} agent does not serve",
                )
    granted = {name for names in spec.callers.values() for name in names}
    for name in sorted(own):
        if name not in granted and ANY not in granted:
            raise _refuse(
                role,
                f"capability {name!r} has no policy entry: name who may call it in callers "
                "(deny by default)",
            )


def _register(spec: AgentSpec) -> None:
    """Register the capabilities, then the role and its ``AgentRole``; a capability the protocol
    refuses (e.g. its messages differ from its models) undoes what was registered."""
    added: list[str] = []
    try:
        for capability in spec.capabilities:
            if capability.name not in CAPABILITIES:
                added.append(capability.name)
            register_capability(capability)
    except ValueError as exc:
        for name in added:
            CAPABILITIES.pop(name, None)
        raise _refuse(spec.role, str(exc)) from exc
    register_role(spec.role)
    _DEFINED[spec.role] = spec
    name = f"{''.join(part.title() for part in spec.role.split('_'))}Agent"
    _TYPES[spec.role] = AgentRole(name, spec, role_builder(spec))
