"""What a step kind is: one row of ``KINDS``, the engine's and validation's view of the kind.

A row says how the scheduler starts a step of the kind (``start``), which of the shared fields
(``StepBase``) the kind does not honour (``refuses``: validation refuses them, naming the step
and the field, derived from the row), what tool a step calls (``tool``) and which steps it nests
(``body``). Code outside ``planning/_kinds`` asks these questions through the table rather than
with ``isinstance`` on a step class (``tests/unit/planning/test_kinds_structure.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stratagem.planning._plan import LoopStep, MapStep, Step, StepBase, SubplanStep

Start = Literal["attempt", "decide", "items", "plans"]
"""How the scheduler starts a step of a kind: ``attempt`` it (tool and cross-agent steps, each
attempt journaled and admitted), ``decide`` it (a gate: a person decides, nothing is attempted),
run its ``items`` (a map) or its nested ``plans`` (a loop, a sub-plan)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Fields a kind does not honour: a value other than the model's default is refused.

    Attributes:
        fields: The fields (refused together, with one problem).
        problem: The one-line problem, formatted with ``id`` (the step's id, quoted).
    """

    fields: tuple[str, ...]
    problem: str

    def problem_of(self, step: StepBase) -> str | None:
        """The problem with ``step``, or ``None`` when it leaves the fields at their defaults.

        Compared with the model's defaults, not with the fields set: a plan travels as its whole
        JSON, defaults included.
        """
        model = type(step).model_fields
        for name in self.fields:
            default = model[name].get_default(call_default_factory=True)
            if getattr(step, name) != default:
                return self.problem.format(id=repr(step.id))
        return None


class Checks(Protocol):
    """The plan-wide rules a kind's ``validate`` applies to a step (``planning/_validate.py``
    implements it for each plan and each body); each returns the problems found, one line each."""

    def tool(self, step: StepBase, tool: str) -> list[str]:
        """``tool`` is in the owner's registry."""
        ...

    def request(
        self, step: StepBase, target: str, capability: str, request: dict[str, Any]
    ) -> list[str]:
        """A cross-agent request: a known role other than the owner, a capability it serves, a
        request that fits it, references to dependencies."""
        ...

    def refs(self, step: StepBase, value: Any) -> list[str]:
        """The references and expressions of ``value`` read only the step's dependencies."""
        ...

    def compensation(self, step: StepBase) -> list[str]:
        """The step's compensation: a tool of the registry, an input reading what it may."""
        ...

    def items(self, step: MapStep) -> list[str]:
        """A map's list, its work per item and its bounds."""
        ...

    def plans(self, step: LoopStep | SubplanStep) -> list[str]:
        """A loop's or a sub-plan's bound, inputs and body (a plan of the same owner)."""
        ...


def _no_tool(step: Any) -> str | None:
    return None


def _no_body(step: Any) -> Sequence[Step]:
    return ()


def _sends_nothing(step: Any) -> dict[str, Any]:
    return {}


def _by_kind(step: Any) -> str:
    return f"step {step.id!r} ({step.kind})"


@dataclass(frozen=True, slots=True)
class StepKind:
    """One step kind: its model and what the engine, validation and replay need of it.

    Attributes:
        name: The ``kind`` discriminator of the ``Step`` union.
        model: The step's pydantic model (a ``StepBase`` subclass, a member of ``Step``).
        what: The kind as a problem or a picture names a step of it ("a gate").
        start: How the scheduler starts it.
        refuses: The fields it does not honour (refused by validation).
        validate: The kind's own problems with a step of it (besides ``refuses``, and the
            dependencies and condition every step is checked for).
        tool: The tool of the owner's registry a step of the kind calls (``None``: none).
        body: The steps a step of the kind nests (its body); empty for most kinds.
        sends: What a step of the kind sends (a tool's input, a request), references
            unresolved: the base of its compensation's default input; ``{}`` for none.
        named: How a prompt names a step of the kind for people (``"gate 'ok'"``).
    """

    name: str
    model: type[StepBase]
    what: str
    start: Start
    validate: Callable[[Checks, Any], list[str]]
    refuses: tuple[Refusal, ...] = ()
    tool: Callable[[Any], str | None] = field(default=_no_tool)
    body: Callable[[Any], Sequence[Step]] = field(default=_no_body)
    sends: Callable[[Any], dict[str, Any]] = field(default=_sends_nothing)
    named: Callable[[Any], str] = field(default=_by_kind)

    @property
    def expanded(self) -> bool:
        """Whether a step of the kind is expanded (into items or nested plans), not attempted."""
        return self.start in ("items", "plans")

    @property
    def compensable(self) -> bool:
        """Whether a step of the kind may name a compensation."""
        return not any("compensate" in refusal.fields for refusal in self.refuses)

    def refused(self, step: StepBase) -> list[str]:
        """The problems of ``step``'s fields this kind does not honour."""
        found = (refusal.problem_of(step) for refusal in self.refuses)
        return [problem for problem in found if problem is not None]
