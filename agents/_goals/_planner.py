"""The goal planner: a goal in plain words (``AskGoal``) as a typed, validated orchestration plan.

Route, then plan (deterministic; ``docs/goals.md`` says it for users):

1. The goal is split into clauses (``split_clauses``). A goal that names an agent that is not
   deployed (``the billing agent``) is refused.
2. Each clause is matched to the directory's capabilities by their intents (``Matcher``); the best
   one is chosen when it scores at least ``MATCH_THRESHOLD``. A clause nothing matches is joined
   back to the clause before it, as written, when that one still lacks a required field (a comma
   or an ``and`` inside a slot: ``schedule lunch with Sam, Ann and Bo on Tuesday``); otherwise,
   or when the joined clause matches nothing either, the goal is refused in one line naming the
   clause and the closest capabilities.
3. The chosen intent's slots are read from the clause, typed by the request model; a field still
   empty takes the goal's ``inputs`` of that name, else an earlier step's output field of that
   name (a reference: the step then depends on it). A required field left empty, or a value the
   request model refuses, refuses the goal naming the clause and the field.
4. Steps depend on the steps whose outputs they read, and on the step before when the clause says
   ``then``; the others run side by side. One clause is the ``single`` route (one cross-agent
   step), several the ``plan`` route. With ``approve``, the steps whose capability has side effects
   wait at a gate (``approve``).

A step that fails for good, whatever its class but ``cancelled`` (``transient`` and
``timeout`` once their retries are spent: ``GOAL_REPLANNED``), is replanned (``replan``): the
next revision drops it and every step that depends on it, and runs the rest; the answer
(``respond``) says what was done and what was not, each step's output under it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from pydantic import BaseModel, ConfigDict, ValidationError

from stratagem.agents._goals._directory import CapabilityDirectory, DirectoryEntry
from stratagem.agents._goals._match import (
    MATCH_THRESHOLD,
    Match,
    Matcher,
    extract_slots,
    split_clauses,
)
from stratagem.agents._orchestration import Assignment, OrchestrationPlan
from stratagem.agents._tool import tool
from stratagem.planning import (
    Budget,
    CrossAgentStep,
    FailureClass,
    GateStep,
    PlanResult,
    Step,
    StepFailure,
    StepStatus,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    AskGoalRequest,
    AskGoalResponse,
    GoalStep,
    InvalidArgumentError,
)
from stratagem.protocol._a2a._client import A2ASkill

__all__ = ["GOAL_REPLANNED", "GoalPlanner", "Pick", "show_goal_plan", "summary"]

GOAL_REPLANNED: Final = frozenset(FailureClass) - {FailureClass.CANCELLED}
"""The failure classes after which a goal's plan is replanned (once a step's retries are spent):
a step its agent refused (``logic``), one that stayed unreachable or slow (``transient``,
``timeout``) or was refused by a rule (``policy``: also a circuit breaker an outage opened) is
dropped with what depends on it, and the rest runs; only a cancelled one ends the goal."""

MAX_CLAUSES: Final = 16
"""The most clauses (so steps) one goal may have."""
PLAN_ONLY_STEP: Final = "plan"
APPROVE_STEP: Final = "approve"
_NAMED_AGENT: Final = re.compile(r"\b(?:the|ask|use)\s+([a-z][a-z0-9_]{0,31})\s+agent\b")


class PlannedGoal(BaseModel):
    """The steps a plan-only goal would run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[dict[str, Any]]


@tool
async def show_goal_plan(steps: list[dict[str, Any]]) -> PlannedGoal:
    """The steps a goal would run (a plan-only ``AskGoal``'s one step; it changes nothing)."""
    return PlannedGoal(steps=steps)


@dataclass(frozen=True, slots=True)
class Pick:
    """A capability chosen for one clause of a goal.

    Attributes:
        text: The clause.
        after_previous: Whether the clause said it comes after the one before (``then``).
        match: The capability and its best intent for the clause, with the score.
        slots: The request's values, when the chooser gave them (a model); ``None``: read
            from the clause by the matched intent.
        after: The earlier picks (indexes) whose steps this one waits for, besides those whose
            outputs it reads.
        chooser: ``matched`` (the router) or ``model``.
    """

    text: str
    after_previous: bool
    match: Match
    slots: dict[str, Any] | None = None
    after: tuple[int, ...] = ()
    chooser: str = "matched"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class GoalPlanner:
    """Plans ``AskGoal`` over a capability directory (see the module docstring).

    Args:
        directory: What may be chosen; by default every registered capability with intents (read
            when the first goal is planned, so extensions imported after the planner count).
    """

    def __init__(self, directory: CapabilityDirectory | None = None) -> None:
        self._directory = directory
        self._matcher: Matcher | None = None
        self._size = -1
        self._external: Mapping[str, Sequence[A2ASkill]] = {}

    def use_external(self, skills: Mapping[str, Sequence[A2ASkill]]) -> None:
        """Plan onto these external A2A agents' skills too (by agent name; their cards'
        examples are their intents), from the next goal on."""
        if dict(skills) != dict(self._external):
            self._external = dict(skills)
            self._matcher = None

    def matcher(self) -> Matcher:
        """The matcher over the directory (rebuilt when the registry grew)."""
        if self._directory is not None:
            if self._matcher is None:
                self._matcher = Matcher(self._directory)
            return self._matcher
        from stratagem.protocol import CAPABILITIES

        if self._matcher is None or self._size != len(CAPABILITIES):
            self._matcher = Matcher(CapabilityDirectory.registered(self._external))
            self._size = len(CAPABILITIES)
        return self._matcher

    # --- planning --------------------------------------------------------------------------

    def plan(self, request: AskGoalRequest, *, plan_id: str) -> OrchestrationPlan:
        """The plan for ``request``.

        Raises:
            protocol.InvalidArgumentError: The goal names an agent that is not deployed, a clause
                nothing matches, a required field no clause, input or earlier output fills, a
                value its request model refuses, or too many clauses: one line naming it.
        """
        matcher = self.matcher()
        agents = matcher.directory.agents
        named = self._named_agent(request.goal, agents)
        clauses = split_clauses(request.goal)
        if not clauses:
            raise InvalidArgumentError("goal: nothing to do in it")
        if len(clauses) > MAX_CLAUSES:
            raise InvalidArgumentError(
                f"goal: {len(clauses)} clauses; at most {MAX_CLAUSES} steps per goal"
            )
        chosen: list[Pick] = []
        for clause in clauses:
            ranked = matcher.ranked(clause.text, agent=named)
            if ranked and ranked[0].score >= MATCH_THRESHOLD:
                chosen.append(Pick(clause.text, clause.after_previous, ranked[0]))
                continue
            if chosen and self._incomplete(chosen[-1], request):
                last = chosen[-1]
                joined = f"{last.text}{clause.sep or ' '}{clause.text}"
                again = matcher.ranked(joined, agent=named)
                if again and again[0].score >= MATCH_THRESHOLD:
                    chosen[-1] = Pick(joined, last.after_previous, again[0])
                    continue
            raise InvalidArgumentError(self._unmatched(clause.text, ranked, agents))
        return self.planned(request, chosen, plan_id=plan_id)

    @staticmethod
    def _incomplete(pick: Pick, request: AskGoalRequest) -> bool:
        """Whether ``pick``'s clause leaves a required field of its request to a piece that
        follows (``schedule lunch with Sam, Ann and Bo on Tuesday``: the day comes last). A clause
        that says all it needs takes nothing more: a piece after it that nothing matches is a
        request of its own (``check the weather in Paris and book a table``), refused by name
        rather than read into a slot."""
        entry = pick.match.entry
        if entry.external:
            return False
        said = extract_slots(pick.text, pick.match)
        return any(
            field.is_required() and name not in said and name not in request.inputs
            for name, field in entry.spec.request.model_fields.items()
        )

    def check_goal(self, request: AskGoalRequest) -> None:
        """Refuse a goal that names an agent not deployed (before a model is asked about it).

        Raises:
            protocol.InvalidArgumentError: One line naming the agent and those deployed.
        """
        matcher = self.matcher()
        self._named_agent(request.goal, matcher.directory.agents)

    def planned(
        self, request: AskGoalRequest, chosen: list[Pick], *, plan_id: str
    ) -> OrchestrationPlan:
        """The plan of ``chosen`` (in order) for ``request``: slots typed and checked, earlier
        outputs bound, the gate, or the plan-only step.

        Raises:
            protocol.InvalidArgumentError: A required field nothing fills, a value its request
                model refuses, more than ``MAX_CLAUSES`` picks.
        """
        if not chosen or len(chosen) > MAX_CLAUSES:
            raise InvalidArgumentError(f"goal: 1 to {MAX_CLAUSES} steps, not {len(chosen)}")
        steps, assignments = self._steps(request, chosen)
        _done_steps(request.done_when, assignments)
        if request.plan_only:
            planned = [
                {
                    "id": s.id,
                    "agent": a.agent,
                    "capability": a.capability,
                    # As text: its references are the planned steps', not this plan's.
                    "request_json": json.dumps(_request(s), sort_keys=True),
                    "depends_on": list(s.depends_on),
                    "why": a.purpose,
                    "score": a.score or 0.0,
                }
                for s, a in zip(steps, assignments, strict=True)
            ]
            steps = [
                ToolStep(
                    id=PLAN_ONLY_STEP,
                    title="show the plan the goal would run",
                    tool="show_goal_plan",
                    input={"steps": planned},
                )
            ]
        return OrchestrationPlan(
            id=plan_id,
            owner="orchestrator",
            goal=_clip(" ".join(request.goal.split()), 200),
            steps=steps,
            assignments=assignments,
            budget=_budget(request),
            deadline=None if request.deadline_s is None else time.time() + request.deadline_s,
        )

    @staticmethod
    def _named_agent(goal: str, agents: list[str]) -> str | None:
        named = _NAMED_AGENT.findall(goal.lower())
        for name in named:
            if name not in agents:
                raise InvalidArgumentError(
                    f"goal: it names the agent {name!r}, which is not deployed with capabilities "
                    f"a goal can use (agents: {', '.join(agents) or 'none'})"
                )
        return named[0] if len(set(named)) == 1 else None

    @staticmethod
    def _unmatched(clause: str, ranked: list[Match], agents: list[str]) -> str:
        closest = ", ".join(f"{m.entry.name} ({m.score:.2f})" for m in ranked[:3] if m.score > 0)
        return _clip(
            f"goal: no capability matches {_clip(clause, 80)!r}"
            + (f"; closest: {closest}" if closest else "")
            + f" (agents with intents: {', '.join(agents) or 'none'})",
            1000,
        )

    def _steps(
        self, request: AskGoalRequest, chosen: list[Pick]
    ) -> tuple[list[Step], list[Assignment]]:
        steps: list[Step] = []
        assignments: list[Assignment] = []
        outputs: list[tuple[str, DirectoryEntry]] = []
        used: set[str] = set()
        gate_needed = request.approve and any(p.match.entry.side_effects for p in chosen)
        if gate_needed:
            names = ", ".join(p.match.entry.name for p in chosen if p.match.entry.side_effects)
            steps.append(
                GateStep(
                    id=APPROVE_STEP,
                    title="approve the steps that change something",
                    prompt=_clip(f"Run {names} for the goal {request.goal!r}?", 2000),
                )
            )
            assignments.append(
                Assignment(
                    step=APPROVE_STEP,
                    agent="orchestrator",
                    capability="gate",
                    purpose="the goal asked for approval before side effects",
                )
            )
        ids: list[str] = []
        for pick in chosen:
            text, after, match = pick.text, pick.after_previous, pick.match
            entry = match.entry
            step_id = (
                f"ask_{entry.external}"[:60] if entry.external else _snake(entry.spec.name)[:60]
            )
            if step_id in used:
                n = 2
                while f"{step_id}_{n}" in used:
                    n += 1
                step_id = f"{step_id}_{n}"
            used.add(step_id)
            if entry.external:  # an external A2A agent's skill: the clause is the message
                values: dict[str, Any] = {
                    "agent": entry.external,
                    "skill": entry.skill,
                    "text": text,
                }
                depends: list[str] = []
            else:
                values, depends = self._request(request, pick, outputs)
            if after and ids:
                depends.append(ids[-1])
            depends += [ids[i] for i in pick.after if 0 <= i < len(ids)]
            if gate_needed and entry.side_effects:
                depends.append(APPROVE_STEP)
            steps.append(
                CrossAgentStep(
                    id=step_id,
                    title=_clip(text, 200),
                    target=entry.agent,
                    capability=entry.spec.name,
                    depends_on=list(dict.fromkeys(depends)),
                    request=values,
                )
            )
            assignments.append(
                Assignment(
                    step=step_id,
                    agent=entry.external or entry.agent,
                    capability=entry.skill or entry.spec.name,
                    purpose=_clip(
                        f"{text!r} matched {match.intent.phrase!r}"
                        if pick.chooser == "matched"
                        else f"{text!r}: the model chose it (its best intent: "
                        f"{match.intent.phrase!r})",
                        500,
                    ),
                    score=match.score,
                )
            )
            outputs.append((step_id, entry))
            ids.append(step_id)
        return steps, assignments

    @staticmethod
    def _request(
        request: AskGoalRequest,
        pick: Pick,
        earlier: list[tuple[str, DirectoryEntry]],
    ) -> tuple[dict[str, Any], list[str]]:
        clause, match = pick.text, pick.match
        entry = match.entry
        model = entry.spec.request
        values: dict[str, Any] = (
            extract_slots(clause, match) if pick.slots is None else dict(pick.slots)
        )
        foreign = sorted(set(values) - set(entry.slots))
        if foreign:
            raise InvalidArgumentError(
                _clip(
                    f"goal: {clause!r}: {', '.join(foreign)} "
                    + ("is not a slot" if len(foreign) == 1 else "are not slots")
                    + f" of {entry.name} (slots: {', '.join(entry.slots) or 'none'})",
                    1000,
                )
            )
        depends: list[str] = []
        for name, field in model.model_fields.items():
            if name in values:
                continue
            if name in request.inputs:
                values[name] = request.inputs[name]
                continue
            for step_id, source in reversed(earlier if field.is_required() else []):
                if name in source.spec.response.model_fields:
                    values[name] = ref(f"{step_id}.{name}")
                    depends.append(step_id)
                    break
            else:
                if field.is_required():
                    example = next(
                        (i.phrase for i in entry.intents if name in i.slots), f"{name}: ..."
                    )
                    raise InvalidArgumentError(
                        _clip(
                            f"goal: {clause!r} asks {entry.name}, which needs {name!r}: say it "
                            f"(e.g. {example!r}) or give it in inputs",
                            1000,
                        )
                    )
        bound = {k for k, v in values.items() if isinstance(v, dict)}
        try:
            model.model_validate({k: v for k, v in values.items() if k not in bound})
        except ValidationError as exc:
            for error in exc.errors():
                field_name = str(error["loc"][0]) if error["loc"] else ""
                if error["type"] == "missing" and field_name in bound:
                    continue
                raise InvalidArgumentError(
                    _clip(
                        f"goal: {clause!r} gives {entry.name} {field_name or 'its request'}="
                        f"{values.get(field_name, '')!r}: {error['msg']}",
                        1000,
                    )
                ) from None
        return values, depends

    # --- replanning ------------------------------------------------------------------------

    def replan(self, plan: OrchestrationPlan, failure: StepFailure) -> OrchestrationPlan | None:
        """The next revision after ``failure``: without the failed step and every step that
        depends on it (their assignments say why they were dropped); ``None`` when nothing
        would be left to run, or the failed step is not one of the plan's cross-agent steps."""
        failed = failure.step_id
        if not any(_agent(s) and s.id == failed for s in plan.steps):
            return None
        if failure.failure_class is FailureClass.POLICY and _EXHAUSTED in failure.message:
            return None  # no revision refills a budget: the goal stops
        dropped = {failed}
        changed = True
        while changed:
            changed = False
            for step in plan.steps:
                if step.id not in dropped and dropped & set(step.depends_on):
                    dropped.add(step.id)
                    changed = True
        kept = [s for s in plan.steps if s.id not in dropped]
        if not any(_agent(s) for s in kept):
            return None
        reason = _clip(f"{failed} failed: {_innermost(failure.message)}", 500)
        assignments = [
            a
            if a.step not in dropped or a.dropped
            else a.model_copy(
                update={"dropped": reason if a.step == failed else f"it depends on {failed}"}
            )
            for a in plan.assignments
        ]
        return plan.model_copy(update={"steps": kept, "assignments": assignments})

    # --- answering -------------------------------------------------------------------------

    def _side_effects(self, agent: str, capability: str) -> bool:
        """Whether the directory's entry for a step's agent and capability (an external
        agent's name and skill) has side effects."""
        for entry in self.matcher().directory.entries:
            if (entry.external or entry.agent) == agent and (
                entry.skill or entry.spec.name
            ) == capability:
                return entry.side_effects
        return False

    def respond(self, request: AskGoalRequest, result: PlanResult[Any]) -> AskGoalResponse:
        """The goal's answer: every step, what came of it, and a summary."""
        plan = result.submitted
        assert isinstance(plan, OrchestrationPlan)
        route = "single" if sum(a.capability != "gate" for a in plan.assignments) == 1 else "plan"
        if request.plan_only:
            planned = result.outputs[PLAN_ONLY_STEP]["steps"]
            steps = [
                GoalStep(
                    id=s["id"],
                    agent=s["agent"],
                    capability=s["capability"],
                    request_json=s["request_json"],
                    depends_on=s["depends_on"],
                    why=s["why"],
                    score=s["score"],
                    side_effects=self._side_effects(s["agent"], s["capability"]),
                    status="planned",
                )
                for s in planned
            ]
            return AskGoalResponse(
                plan_id=plan.id,
                status="planned",
                route=route,
                summary=f"planned {len(steps)} step(s); nothing ran",
                steps=steps,
                revisions=plan.revision,
            )
        by_id = {s.id: s for s in plan.steps}
        steps = []
        for a in plan.assignments:
            step = by_id.get(a.step)
            output = result.outputs.get(a.step)
            status = "dropped" if a.dropped else result.statuses.get(a.step, StepStatus.PENDING)
            steps.append(
                GoalStep(
                    id=a.step,
                    agent=a.agent,
                    capability=a.capability,
                    request_json=json.dumps(step.request, sort_keys=True) if _agent(step) else "",
                    depends_on=list(step.depends_on) if step is not None else [],
                    why=a.purpose,
                    score=a.score or 0.0,
                    side_effects=self._side_effects(a.agent, a.capability),
                    status=str(getattr(status, "value", status)),
                    output_json="" if output is None else json.dumps(output, sort_keys=True),
                    error=a.dropped,
                )
            )
        work = [s for s in steps if s.capability != "gate"]
        done = [s for s in work if s.status == "succeeded"]
        status = "succeeded" if len(done) == len(work) else ("partial" if done else "failed")
        met: bool | None = None
        said = summary(work)
        if request.done_when:
            named = _done_steps(request.done_when, plan.assignments)
            missing = [s for s in work if s.id in named and s.status != "succeeded"]
            met = not missing
            said = _clip(
                said
                + "\ndefinition of done: "
                + (
                    f"met ({', '.join(request.done_when)})"
                    if met
                    else "not met: " + ", ".join(f"{s.id} {s.status}" for s in missing)
                ),
                8000,
            )
        return AskGoalResponse(
            plan_id=plan.id,
            status=status,
            route=route,
            summary=said,
            steps=steps,
            revisions=plan.revision,
            done=met,
        )


_FAILED: Final = re.compile(
    r" failed \((?:logic|transient|timeout|policy|cancelled)\)(?: after \d+ attempt\(s\))?: "
)


_EXHAUSTED: Final = "budget exhausted: "
"""How the engine's refusal of an attempt past the plan's budget begins."""


def _budget(request: AskGoalRequest) -> Budget | None:
    """The plan's budget: the request's, its wall time bounded by the goal's deadline."""
    given = request.budget
    wall = given.wall_time_s if given is not None else None
    if request.deadline_s is not None:
        wall = request.deadline_s if wall is None else min(wall, request.deadline_s)
    if given is None and wall is None:
        return None
    return Budget(
        wall_time_s=wall,
        tool_calls=given.tool_calls if given is not None else None,
        cost_units=given.cost_units if given is not None else None,
    )


def _done_steps(done_when: Sequence[str], assignments: Sequence[Assignment]) -> set[str]:
    """The ids of the steps the definition of done names (by id, ``Capability`` or
    ``agent.Capability``).

    Raises:
        protocol.InvalidArgumentError: A name that is no step of the plan: one line naming it.
    """
    found: set[str] = set()
    work = [a for a in assignments if a.capability != "gate"]
    for name in done_when:
        hits = {a.step for a in work if name in (a.step, a.capability, f"{a.agent}.{a.capability}")}
        if not hits:
            shown = ", ".join(f"{a.step} ({a.agent}.{a.capability})" for a in work)
            problem = f"done_when: {name!r} names no step of the goal's plan (steps: {shown})"
            raise InvalidArgumentError(_clip(problem, 1000))
        found |= hits
    return found


def _innermost(message: str) -> str:
    """The reason at the bottom of a nested failure's message (a sub-plan's step's own)."""
    return _FAILED.split(message)[-1]


def _said(output_json: str) -> str:
    """A step's output in a few words: its ``summary`` or ``text`` field, else its JSON."""
    if not output_json:
        return ""
    value = json.loads(output_json)
    if isinstance(value, dict):
        for key in ("summary", "text", "message"):
            if isinstance(value.get(key), str) and value[key]:
                return _clip(value[key], 200)
    return _clip(output_json, 200)


def summary(steps: list[GoalStep]) -> str:
    """What was done and what was not, one line each, in plan order."""
    lines = []
    for s in steps:
        what = s.why.split("' matched", 1)[0].lstrip("'") if s.why else s.capability
        if s.status == "succeeded":
            lines.append(f"done: {what}: {_said(s.output_json)}")
        else:
            lines.append(f"not done: {what}: {s.error or s.status}")
    return _clip("\n".join(lines), 8000)


def _agent(step: object) -> TypeGuard[CrossAgentStep]:
    """Whether ``step`` is one of the plan's cross-agent steps (the only kind it plans)."""
    return isinstance(step, CrossAgentStep)


def _request(step: object) -> dict[str, Any]:
    """A cross-agent step's request (``{}`` for a step of another kind)."""
    return dict(step.request) if _agent(step) else {}
