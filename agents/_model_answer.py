"""What a role asks its model, as data: ``ModelAnswer``.

A built-in role does not subclass ``ModelPlanner``: it declares one ``ModelAnswer`` (the requests
it answers with the model, its system prompt, how it asks, the schema of the answer, how the
answer becomes its plan, the judge of that plan, and optionally a check before the model is asked
and a response of its own), and ``ModelPlanner(answer=...)`` composes it. A request of another
type goes to the role's own planner, unasked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from stratagem.planning import Plan, PlanResult
from stratagem.protocol import WireModel

__all__ = ["DeterministicPlanner", "ModelAnswer", "PlanJudge"]

R = TypeVar("R", bound=WireModel)


class DeterministicPlanner(Protocol):
    """What a model planner falls back on and answers with (the role's own planner)."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan: ...

    def respond(self, capability: str, request: WireModel, result: Any) -> WireModel: ...


PlanJudge = Callable[[Plan, WireModel], Awaitable[list[str]]]
"""A role's deterministic check of a proposed plan: the problems found ([] accepts it)."""


@dataclass(frozen=True, slots=True)
class ModelAnswer(Generic[R]):
    """A role's narrow answer: what its model is asked, and how the answer becomes its plan.

    Attributes:
        request: The request model it answers (others are planned by the role's own planner).
        system: The system message.
        ask: The user message for a request.
        schema: The JSON Schema of the answer to a request (enums from the request's facts).
        build: ``(answer, request, plan_id, planner)`` -> the plan, or the problems that refuse
            the answer (``planner``: the role's own planner, for a part it plans itself).
        judge: The role's deterministic check of the plan built (``None``: no check).
        check: Run before the model is asked, with the role's planner (raises to refuse).
        respond: ``(request, result)`` -> a response of its own, or ``None`` for the role's
            planner's.
    """

    request: type[R]
    system: str
    ask: Callable[[R], str]
    schema: Callable[[R], dict[str, Any]]
    build: Callable[[Any, R, str, DeterministicPlanner], tuple[Plan | None, list[str]]]
    judge: PlanJudge | None = None
    check: Callable[[R, DeterministicPlanner], None] | None = None
    respond: Callable[[R, PlanResult[Any]], WireModel | None] | None = None

    def answers(self, request: WireModel) -> bool:
        """Whether ``request`` is one this answer is asked for."""
        return isinstance(request, self.request)

    def __instancecheck__(self, planner: object) -> bool:
        # The old names of the role model planners (``PerceptionModelPlanner``...) are their
        # answers: ``isinstance(planner, PerceptionModelPlanner)`` still says which role's
        # answer a model planner composes.
        return getattr(planner, "answer", None) is self
