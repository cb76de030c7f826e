"""Plan revisions: structured diffs between two revisions, and which results carry over.

A replan never edits a plan: it makes a new revision (``revision + 1``) whose parent is the old
one, with a ``RevisionDiff`` (steps added, removed, changed) and a rationale, kept by the store as
a ``RevisionRecord``. Results of the parent's completed steps carry over to the new revision when
the step is **unchanged**: its definition (kind, tool / target / capability, input / request,
depends_on) is equal in both revisions, and every one of its dependencies is unchanged too (so a
step downstream of a changed step runs again even when its own definition is the same).

A step is *changed* in the diff when any of its fields (``status`` aside) differs, so a new title,
timeout or retry policy shows in the diff but does not stop its result from carrying over. A loop's
or a sub-plan's body is diffed step by step: its changes show as fields ``steps/ID.FIELD``,
``steps/+ID`` (added) and ``steps/-ID`` (removed) beside ``steps``. A map whose definition is
unchanged carries the results of the items that had succeeded (``carried`` lists their keys,
``f"{step_id}.{index}"``), so a new revision runs only the rest of its items.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from stratagem.planning._errors import StepFailure
from stratagem.planning._plan import FailureClass, Plan, Step

__all__ = [
    "Replanner",
    "Revision",
    "RevisionDiff",
    "RevisionRecord",
    "StepChange",
    "diff_plans",
    "failure_repaired",
    "replan_rationale",
    "replanned_classes",
    "unchanged_steps",
]

# The fields that define what a step does; equal definitions (and unchanged dependencies) let a
# completed step's result carry over to a new revision (a map's list and work, a loop's or a
# sub-plan's body, inputs and bounds included).
_DEFINITION: Final = (
    "kind",
    "tool",
    "target",
    "capability",
    "input",
    "request",
    "depends_on",
    "over",
    "steps",
    "until",
    "inputs",
    "max_iterations",
    "timebox_s",
    "on_exhausted",
    "on_failure",
)
_IGNORED: Final = frozenset({"status"})


@dataclass(frozen=True, slots=True)
class StepChange:
    """A step present in both revisions whose fields differ.

    Attributes:
        step_id: The step.
        fields: The names of the fields that differ, sorted.
    """

    step_id: str
    fields: list[str]


@dataclass(frozen=True, slots=True)
class RevisionDiff:
    """How a revision differs from its parent; each list is in plan order.

    Attributes:
        added: Ids of steps only in the new revision.
        removed: Ids of steps only in the parent.
        changed: Steps in both whose fields differ.
    """

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[StepChange] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The diff as JSON-ready data."""
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": [{"step_id": c.step_id, "fields": list(c.fields)} for c in self.changed],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RevisionDiff:
        """The diff ``to_json`` produced."""
        return cls(
            added=list(data.get("added", [])),
            removed=list(data.get("removed", [])),
            changed=[StepChange(c["step_id"], list(c["fields"])) for c in data.get("changed", [])],
        )


@dataclass(frozen=True, slots=True)
class RevisionRecord:
    """One revision of a plan, as the store keeps its history.

    Attributes:
        plan_id: The plan.
        revision: The revision.
        parent: The revision it was made from (``None`` for the first).
        rationale: Why it was made.
        author: Who (or what) made it, e.g. ``"operator:ana"`` or ``"replanner:tactical"``.
        diff: How it differs from its parent (empty for the first).
        carried: Ids of the parent's completed steps whose results carried over.
        at: Wall-clock time it was made (``time.time()``).
    """

    plan_id: str
    revision: int
    parent: int | None
    rationale: str = ""
    author: str = ""
    diff: RevisionDiff = field(default_factory=RevisionDiff)
    carried: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class Revision:
    """A revision made by ``Engine.replan`` (or by the engine on a logic failure).

    Attributes:
        plan: The new revision's plan (its ``revision`` set, step statuses reset).
        record: Its history entry (parent, diff, rationale, what carried over).
    """

    plan: Plan
    record: RevisionRecord

    @property
    def revision(self) -> int:
        """The new revision's number."""
        return self.record.revision

    @property
    def diff(self) -> RevisionDiff:
        """How it differs from its parent."""
        return self.record.diff


REPLANNED: Final = frozenset({FailureClass.LOGIC})
"""The failure classes a replanner is asked about unless it says otherwise
(``Replanner``'s ``failure_classes``)."""


class Replanner(Protocol):
    """Makes a new plan when a step fails for good (the agent's planner).

    The engine calls it (at most ``EngineConfig.max_replans`` times per run) after the run
    stopped on a failure of a class it takes: ``logic`` (``REPLANNED``), unless it has an
    attribute ``failure_classes`` (a ``frozenset`` of ``FailureClass``) naming others, e.g. also
    ``transient`` and ``timeout`` once their retries are spent; ``cancelled`` failures are never
    replanned. A returned plan becomes the next revision (its ``id`` and
    ``revision`` are set by the engine) and the run continues with it, results of unchanged
    completed steps carried over. ``None`` lets the plan fail.
    """

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | Awaitable[Plan | None] | None:
        """A new plan for ``plan`` after ``failure``, or ``None`` to let it fail; a replanner
        that asks a model returns an awaitable, which the engine awaits."""
        ...


def replanned_classes(replanner: object) -> frozenset[FailureClass]:
    """The failure classes ``replanner`` is asked about: its ``failure_classes``, else
    ``REPLANNED``.

    Raises:
        TypeError: ``failure_classes`` is not a set of ``FailureClass``.
    """
    classes = getattr(replanner, "failure_classes", REPLANNED)
    if not isinstance(classes, frozenset | set) or not all(
        isinstance(c, FailureClass) for c in classes
    ):
        raise TypeError(f"{type(replanner).__name__}.failure_classes is not a set of FailureClass")
    return frozenset(classes)


_RATIONALE: Final = re.compile(
    r"step '(?P<step>[^']*)' failed \((?P<cls>[a-z]+)\): (?P<message>.*)", re.S
)


def replan_rationale(failure: StepFailure) -> str:
    """The rationale of a revision the engine's replanner made after ``failure``."""
    return f"step {failure.step_id!r} failed ({failure.failure_class.value}): {failure.message}"


def failure_repaired(record: RevisionRecord) -> StepFailure | None:
    """The failure a revision the engine's replanner made was asked to repair, read back from its
    rationale (``replan_rationale``); ``None`` for a revision made another way (an operator's).

    Replay re-derives a model's repairs from it: the same failure, the same question to the model.
    """
    found = _RATIONALE.fullmatch(record.rationale)
    if found is None:
        return None
    try:
        failure_class = FailureClass(found["cls"])
    except ValueError:
        return None
    return StepFailure(found["step"], failure_class, found["message"], attempts=0)


def _fields(step: Step) -> dict[str, Any]:
    return {k: v for k, v in step.model_dump(mode="json").items() if k not in _IGNORED}


def diff_plans(old: Plan, new: Plan) -> RevisionDiff:
    """The structured diff from ``old`` to ``new`` (step statuses ignored).

    Args:
        old: The parent revision.
        new: The new revision.
    """
    old_steps = {step.id: step for step in old.steps}
    new_ids = {step.id for step in new.steps}
    added = [step.id for step in new.steps if step.id not in old_steps]
    removed = [step.id for step in old.steps if step.id not in new_ids]
    changed = []
    for step in new.steps:
        before = old_steps.get(step.id)
        if before is None:
            continue
        a, b = _fields(before), _fields(step)
        differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if "steps" in differing:
            differing.extend(_body_changes(a.get("steps") or [], b.get("steps") or [], "steps/"))
        if differing:
            changed.append(StepChange(step.id, differing))
    return RevisionDiff(added, removed, changed)


def _body_changes(old: list[Any], new: list[Any], prefix: str) -> list[str]:
    """How a nested body changed, as diff fields (``steps/ID.FIELD``, ``steps/+ID``,
    ``steps/-ID``), nested bodies included."""
    before = {step["id"]: step for step in old}
    after = {step["id"]: step for step in new}
    found = [f"{prefix}+{step_id}" for step_id in after if step_id not in before]
    found += [f"{prefix}-{step_id}" for step_id in before if step_id not in after]
    for step_id, step in after.items():
        previous = before.get(step_id)
        if previous is None:
            continue
        for name in sorted(previous.keys() | step.keys()):
            if name == "status" or previous.get(name) == step.get(name):
                continue
            found.append(f"{prefix}{step_id}.{name}")
            if name == "steps":
                found += _body_changes(
                    previous.get(name) or [], step.get(name) or [], f"{prefix}{step_id}/steps/"
                )
    return found


def unchanged_steps(old: Plan, new: Plan) -> set[str]:
    """Ids of the steps of ``new`` that are unchanged from ``old``.

    A step is unchanged when its definition (kind, tool / target / capability, input / request,
    depends_on) equals the parent's and all its dependencies are unchanged too.
    """
    old_steps = {step.id: step for step in old.steps}
    new_steps = {step.id: step for step in new.steps}
    memo: dict[str, bool] = {}

    def same(step_id: str, seen: frozenset[str]) -> bool:
        if step_id in memo:
            return memo[step_id]
        before, after = old_steps.get(step_id), new_steps.get(step_id)
        result = (
            before is not None
            and after is not None
            and step_id not in seen
            and _definition(before) == _definition(after)
            and all(same(dep, seen | {step_id}) for dep in after.depends_on)
        )
        memo[step_id] = result
        return result

    return {step_id for step_id in new_steps if same(step_id, frozenset())}


def _definition(step: Step) -> tuple[Any, ...]:
    data = step.model_dump(mode="json", include=set(_DEFINITION))
    return tuple(data.get(name) for name in _DEFINITION)
