"""Forking a plan: a new plan whose steps before a fork point carry their recorded results.

``make_fork`` reads one revision of a stored plan and its journal, picks the steps **before the
fork point** (those whose success was recorded before the fork step first started; without a
fork step, every step that succeeded in the revision), substitutes the outputs it is given for
some of them (their dependents, transitively, then run again), and stores the new plan (a new
id, ``Plan.forked_from`` naming its origin) with those results as the first records of its
journal, in one transaction. ``Engine.resume`` then runs it: restoring a journal already skips
the steps it records as succeeded, so they do not run again, and the rest runs once, under the
new plan's idempotency keys.

A step whose compensation ran in the original (its effect undone) does not carry: it runs again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from stratagem.planning._errors import ForkError, PlanControlError, field_problems
from stratagem.planning._plan import CrossAgentStep, Fork, Plan, Step, StepStatus, ToolStep
from stratagem.planning._revisions import RevisionRecord
from stratagem.planning._store import (
    CompensationRecord,
    CompensationStatus,
    ConditionRecord,
    GateDecision,
    GateRecord,
    Record,
    StateStore,
    StepIntent,
    StepResult,
)
from stratagem.protocol import CAPABILITIES

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)


async def make_fork(
    store: StateStore,
    plan_id: str,
    new_plan_id: str,
    *,
    at_step: str | None,
    revision: int | None,
    outputs: Mapping[str, Any],
    author: str,
    plan_type: type[P],
    clock: Callable[[], float],
    tools: object = None,
) -> P:
    """Store the fork of ``plan_id`` as ``new_plan_id`` (see the module docstring).

    ``tools`` (the engine's tool runner) is asked whether a tool step's substituted output fits
    the tool's output model (``output_problems``, as ``agents.ToolRegistry`` has it); a
    cross-agent step's must fit its capability's response.

    Raises:
        ForkError: No such revision or fork step, or an output given for a step that is not
            before the fork point (or is not a JSON object, or does not fit the step's output).
        PlanControlError: The plan is unknown, or ``new_plan_id`` is taken.
        StoreError: When the store fails.
    """
    if await store.load(new_plan_id) is not None:
        raise PlanControlError(new_plan_id, f"plan {new_plan_id!r} exists already")
    newest = await store.load(plan_id)
    if newest is None:
        raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
    state = newest
    if revision is not None and revision != newest.revision:
        found = await store.load(plan_id, revision) if 0 < revision < newest.revision else None
        if found is None:
            raise ForkError(
                plan_id,
                "revision",
                f"plan {plan_id!r} has no revision {revision} (revisions 1 to {newest.revision})",
            )
        state = found
    plan = state.plan(plan_type)
    ids = [step.id for step in plan.steps]
    if at_step is not None and at_step not in ids:
        raise ForkError(
            plan_id,
            "at_step",
            f"revision {state.revision} of plan {plan_id!r} has no step {at_step!r} "
            f"(steps: {', '.join(ids)})",
        )
    records = await store.journal(plan_id, state.revision)
    before = _before(records, at_step)
    for compensation in state.compensations:  # their effects were undone: they run again
        if compensation.status is CompensationStatus.COMPENSATED:
            before.pop(compensation.step_id, None)
    point = f"step {at_step!r}" if at_step is not None else f"the end of revision {state.revision}"
    _check_substituted(plan_id, plan, before, point, outputs, tools)
    redo = _descendants(plan, set(outputs))
    carried = [step_id for step_id in before if step_id not in redo]
    fork = Fork(
        plan_id=plan_id,
        revision=state.revision,
        at_step=at_step or "",
        carried=carried,
        substituted=sorted(outputs),
        author=author,
    )
    steps = [
        step
        if step.status is StepStatus.PENDING
        else step.model_copy(update={"status": StepStatus.PENDING})
        for step in plan.steps
    ]
    new = plan.model_copy(
        update={"id": new_plan_id, "revision": 1, "steps": steps, "forked_from": fork}
    )
    seeded = _seeded(plan, new_plan_id, state.revision, carried, before, outputs)
    rationale = f"forked from plan {plan_id!r} revision {state.revision} at {point}"
    if outputs:
        rationale += f", outputs of {', '.join(sorted(outputs))} substituted"
    record = RevisionRecord(new_plan_id, 1, None, rationale, author, carried=carried, at=clock())
    await store.save_revision(new, record, seeded)
    logger.info(
        "plan %s forked from %s@%d at %s by %s: %d result(s) carried",
        new_plan_id,
        plan_id,
        state.revision,
        point,
        author,
        len(carried),
    )
    return new


def _check_substituted(
    plan_id: str,
    plan: Plan,
    before: dict[str, tuple[int, Any]],
    point: str,
    outputs: Mapping[str, Any],
    tools: object,
) -> None:
    """Each output a fork substitutes names a step before the fork point and fits its output.

    Raises:
        ForkError: Naming the first output that does not (its field: ``set.STEP``).
    """
    ids = [step.id for step in plan.steps]
    for step_id, output in outputs.items():
        if step_id not in ids:
            raise ForkError(plan_id, f"set.{step_id}", f"plan {plan_id!r} has no step {step_id!r}")
        if step_id not in before:
            raise ForkError(
                plan_id,
                f"set.{step_id}",
                f"step {step_id!r} is not before the fork point ({point}): it did not succeed "
                f"before it",
            )
        if not isinstance(output, dict):
            raise ForkError(plan_id, f"set.{step_id}", "an output must be a JSON object")
        unfit = _output_problems(plan.step(step_id), output, tools)
        if unfit:
            raise ForkError(
                plan_id,
                f"set.{step_id}",
                f"the output does not fit step {step_id!r}'s output: {'; '.join(unfit[:3])}",
            )


def _seeded(
    plan: Plan,
    new_plan_id: str,
    revision: int,
    carried: list[str],
    before: dict[str, tuple[int, Any]],
    outputs: Mapping[str, Any],
) -> list[Record]:
    """The first records of a fork's journal: each carried result (substituted or as recorded in
    ``plan``'s ``revision``) and the compensation it still owes."""
    by_id = {step.id: step for step in plan.steps}
    seeded: list[Record] = []
    for step_id in carried:
        substituted = step_id in outputs
        output = outputs[step_id] if substituted else before[step_id][1]
        seeded.append(
            StepResult(
                new_plan_id,
                1,
                step_id,
                before[step_id][0],
                StepStatus.SUCCEEDED,
                json.dumps(output),
                message=(
                    f"output substituted when forked from plan {plan.id!r}"
                    if substituted
                    else f"carried from plan {plan.id!r} revision {revision}"
                ),
            )
        )
        if by_id[step_id].compensate is not None:
            seeded.append(CompensationRecord(new_plan_id, 1, step_id, CompensationStatus.NEEDED))
    return seeded


def _output_problems(step: Step, output: dict[str, Any], tools: object) -> list[str]:
    """What is wrong with ``output`` as ``step``'s output, one line a field (empty: it fits, or
    the step's kind declares no output model)."""
    if isinstance(step, ToolStep):
        check = getattr(tools, "output_problems", None)
        found = check(step.tool, output) if callable(check) else []
        return [str(line) for line in found]
    if isinstance(step, CrossAgentStep):
        spec = CAPABILITIES.get(step.capability)
        if spec is None:
            return []
        try:
            spec.response.model_validate(output)
        except ValidationError as exc:
            return field_problems(exc)
    return []


def _before(records: list[Record], at_step: str | None) -> dict[str, tuple[int, Any]]:
    """Step id -> (attempt, output) of the steps recorded as succeeded before ``at_step`` first
    started (its intent, its gate's opening, its condition or its skip), in journal order;
    ``None``: every step recorded as succeeded."""
    done: dict[str, tuple[int, Any]] = {}
    for record in records:
        if at_step is not None and _starts(record, at_step):
            break
        if isinstance(record, StepResult):
            if record.status is StepStatus.SUCCEEDED:
                done[record.step_id] = (
                    record.attempt,
                    None if record.output_json is None else json.loads(record.output_json),
                )
            else:
                done.pop(record.step_id, None)
    return done


def _starts(record: Record, step_id: str) -> bool:
    if isinstance(record, StepIntent | StepResult | ConditionRecord):
        return record.step_id == step_id
    if isinstance(record, GateRecord):
        return record.gate_id == step_id and record.decision is GateDecision.OPEN
    return False


def _descendants(plan: Plan, roots: set[str]) -> set[str]:
    """The steps that (transitively) depend on any of ``roots``."""
    dependents: dict[str, list[str]] = {step.id: [] for step in plan.steps}
    for step in plan.steps:
        for dep in step.depends_on:
            dependents.setdefault(dep, []).append(step.id)
    found: set[str] = set()
    stack = [d for root in roots for d in dependents.get(root, [])]
    while stack:
        current = stack.pop()
        if current in found:
            continue
        found.add(current)
        stack.extend(dependents.get(current, []))
    return found
