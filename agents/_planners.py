"""What an agent serves and who plans it: the ``Planner`` protocol, the agent's table of
capabilities with the planner of each, and the engine's replanner that asks those planners.

``Capabilities`` is the one writer of the table (``Agent.__init__`` fills it with the protocol's
built-in capabilities of the role, ``use_planner`` and ``add_capability`` change it through it).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from stratagem.agents._records import PlanBook
from stratagem.planning import FailureClass, Plan, PlanResult, StepFailure, replanned_classes
from stratagem.protocol import CAPABILITIES, CapabilitySpec, WireModel

__all__ = ["Capabilities", "Planner", "PlannerReplanner"]


class Planner(Protocol):
    """Turns a capability request into a plan, and the plan's result into the response."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan | Awaitable[Plan]:
        """The plan that serves ``request`` (a model planner returns an awaitable: the agent
        awaits it on its event loop, serving other calls meanwhile).

        Args:
            capability: The capability's name.
            request: The validated request model.
            plan_id: The id the plan must carry.

        Returns:
            A plan of the agent's plan type, owned by the agent's role.
        """
        ...

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The capability's response, built from a succeeded plan's outputs."""
        ...


class Capabilities:
    """The capabilities one agent serves, each with its planner.

    Args:
        role: The agent's role.
        planner: The planner of every built-in capability the protocol assigns to ``role``.
    """

    def __init__(self, role: str, planner: Planner) -> None:
        self._role = role
        self._handlers: dict[str, tuple[CapabilitySpec, Planner]] = {
            spec.name: (spec, planner) for spec in CAPABILITIES.values() if spec.role == role
        }

    def __contains__(self, capability: object) -> bool:
        return capability in self._handlers

    def get(self, capability: str) -> tuple[CapabilitySpec, Planner] | None:
        """The capability's spec and planner (``None``: not served here)."""
        return self._handlers.get(capability)

    def planner_of(self, capability: str) -> Planner | None:
        """The planner serving ``capability`` (``None``: not served here)."""
        handler = self._handlers.get(capability)
        return handler[1] if handler is not None else None

    def specs(self) -> dict[str, CapabilitySpec]:
        """The capabilities served, by name."""
        return {name: spec for name, (spec, _) in self._handlers.items()}

    def replace_planner(self, old: Planner, new: Planner) -> None:
        """Plan with ``new`` every capability ``old`` plans."""
        for name, (spec, current) in list(self._handlers.items()):
            if current is old:
                self._handlers[name] = (spec, new)

    def add(self, spec: CapabilitySpec, planner: Planner) -> None:
        """Serve ``spec`` too, planned by ``planner`` (``Agent.add_capability`` says the rules).

        Raises:
            ValueError: The spec is for another role, is not registered, or the name is taken.
        """
        if spec.role != self._role:
            raise ValueError(f"capability {spec.name!r} is served by {spec.role}, not {self._role}")
        if CAPABILITIES.get(spec.name) != spec:
            raise ValueError(
                f"capability {spec.name!r} is not registered; call protocol.register_capability"
            )
        if spec.name in self._handlers and self._handlers[spec.name][0] != spec:
            raise ValueError(f"the {self._role} agent already serves {spec.name!r}")
        self._handlers[spec.name] = (spec, planner)


class PlannerReplanner:
    """The engine's ``Replanner``: asks the planner that made a plan for its next revision.

    A planner takes part by having a ``replan(plan, failure) -> Plan | None`` method; plans
    submitted directly (no capability) and planners without one are not replanned. A planner is
    asked after ``logic`` failures only, unless its ``failure_classes`` names others too
    (``planning.Replanner``): the engine hands this replanner every class but ``cancelled``, and
    it passes each on only to a planner that takes its class.

    Args:
        book: The agent's plan records (which capability a plan serves).
        planner_of: The planner serving a capability.
    """

    failure_classes = frozenset(FailureClass) - {FailureClass.CANCELLED}

    def __init__(self, book: PlanBook, planner_of: Callable[[str], object | None]) -> None:
        self._book = book
        self._planner_of = planner_of

    async def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        record = self._book.get(plan.id)
        planner = self._planner_of(record.capability) if record is not None else None
        replan = getattr(planner, "replan", None)
        if not callable(replan) or failure.failure_class not in replanned_classes(planner):
            return None
        new_plan = replan(plan, failure)
        if inspect.isawaitable(new_plan):  # a model planner's repair
            new_plan = await new_plan
        return new_plan if isinstance(new_plan, Plan) else None
