"""The orchestrator: pursues a story goal by assigning work to the other agents.

Its plans are cross-agent steps, and one tool of its own that reads, not acts: ``confirm_goal``.
``SubmitGoal(goal, passage, beats=N)``:

=============  ============================================  =====================================
step           request                                       depends on
=============  ============================================  =====================================
``extract``    perception.ExtractEntities(passage)
``spatial``    perception.FindSpatialContext(entity ids)     extract
``analyze``    strategic.AnalyzeNarrative(passage, entities)  extract
``arc``        strategic.PlanNarrativeArc(goal, protagonist  analyze, spatial
               id, themes, facts, N)
``beat_i``     tactical.PlanExecutionSequence(beat i, beats  arc, spatial (all beats in parallel)
               1..i-1, facts)
``apply``      perception.UpdateWorldState(beat_N.actions)   every beat
``observe``    perception.FindSpatialContext(entity ids)     apply
``confirm``    confirm_goal(arc.beats, observe.facts)        observe (a tool: fails when a goal
                                                             fact does not hold)
=============  ============================================  =====================================

Every beat is planned cumulatively from the opening state: beat *i*'s sequence reaches beat *i*'s
goals and every earlier beat's. The last beat's sequence therefore reaches every beat's goals, and
it alone is applied; the other beats' sequences show that each stage is reachable on its own (and
run in parallel). The arc's templates only use goals that later beats keep, so the cumulative goals
are always consistent.

Every perception step names the goal's world (``SubmitGoalRequest.world``); a goal that names none
gets a fresh world of its own, named after its plan id (``goal_world``), so facts left by earlier
goals never decide its outcome. The response says which world it was.

A goal whose arc already holds in the passage yields an empty final sequence; ``apply`` then
changes nothing, and the answer says so: status ``already_holds`` and a note naming the facts
(never a plain success with nothing done).

A goal succeeds only when what it set out to reach holds in the world afterwards: ``observe`` reads
the goal's world back from the perception agent once ``apply`` changed it, and ``confirm`` checks
every beat's goal facts against what it read (checked, not assumed: a sequence applied to a world
that changed meanwhile, or an arc that missed the goal, fails the plan with class ``logic`` naming
the facts that do not hold).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._role import RoleAgent, RoleSpec
from stratagem.agents._tool import Tool, tool
from stratagem.planning import (
    CrossAgentStep,
    LogicError,
    Plan,
    PlanResult,
    Step,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    ALREADY_HOLDS,
    Beat,
    Relation,
    SubmitGoalRequest,
    SubmitGoalResponse,
    WireModel,
)

__all__ = [
    "Assignment",
    "OrchestrationPlan",
    "OrchestratorAgent",
    "OrchestratorPlanner",
    "confirmation_steps",
    "goal_response",
    "goal_world",
    "orchestrator_tools",
]

BEAT_MAX_DEPTH = 16
"""The longest action sequence the tactical agent searches for, per beat."""


_NOT_IN_A_NAME = re.compile(r"[^a-z0-9_.-]+")


def goal_world(request: SubmitGoalRequest, plan_id: str) -> str:
    """The world a goal runs in: the one it names, else a fresh one named after its plan id
    (lowercased, other characters than letters, digits, ``_``, ``.`` and ``-`` made ``-``)."""
    if request.world:
        return request.world
    name = _NOT_IN_A_NAME.sub("-", plan_id.lower()).strip("-._")[:64].rstrip("-._")
    return name or "goal"


def goal_response(
    request: SubmitGoalRequest,
    result: PlanResult[Any],
    *,
    beats: list[Beat],
    last_beat: str,
    world: str,
) -> SubmitGoalResponse:
    """A goal's answer from its plan's outputs: ``already_holds`` (with a note naming the facts)
    when it succeeded and the last beat needed no action."""
    out = result.outputs
    actions = out[last_beat]["actions"]
    status = result.status.value
    note = ""
    if status == "succeeded" and not actions:
        status = ALREADY_HOLDS
        held = [f"{g.predicate}({g.subject}, {g.object})" for beat in beats for g in beat.goals]
        note = (
            f"the goal already holds in world {world!r} before any action "
            f"({', '.join(dict.fromkeys(held))}): nothing was done"
        )[:2000]
    return SubmitGoalResponse(
        plan_id=result.submitted.id,
        status=status,
        beats=beats,
        actions=actions,
        added=out["apply"]["added"],
        removed=out["apply"]["removed"],
        world=world,
        note=note,
    )


class Assignment(BaseModel):
    """Which agent does what, in which step.

    Attributes:
        step: The plan step.
        agent: The role that does it.
        capability: The capability asked for.
        purpose: Why.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    agent: str
    capability: str
    purpose: str = ""


class OrchestrationPlan(Plan):
    """An orchestration plan: cross-agent steps and who is assigned to each.

    Attributes:
        assignments: One per step, in plan order.
    """

    assignments: list[Assignment] = Field(default_factory=list)


class Confirmed(BaseModel):
    """The goal facts found holding in the world."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    holding: list[Relation]


def _fact(fact: Relation) -> str:
    return f"{fact.predicate}({fact.subject}, {fact.object})"


@tool
async def confirm_goal(beats: list[Beat], facts: list[Relation]) -> Confirmed:
    """Check that every beat's goal facts hold among ``facts`` (the world read back after the
    goal's actions were applied); a fact that does not hold fails the goal."""
    holding = {(f.subject, f.predicate, f.object) for f in facts}
    goals = list(dict.fromkeys(g for beat in beats for g in beat.goals))
    missing = [g for g in goals if (g.subject, g.predicate, g.object) not in holding]
    if missing:
        raise LogicError(
            "the goal does not hold in the world afterwards: "
            + ", ".join(_fact(g) for g in missing[:8])
            + (" is" if len(missing) == 1 else " are")
            + " not true"
        )
    return Confirmed(holding=goals)


def orchestrator_tools() -> list[Tool[Any, Any]]:
    """The orchestrator's one tool: ``confirm_goal`` (it reads; it changes nothing)."""
    return [confirm_goal]


def confirmation_steps(after: str, beats: Any, world: str) -> list[Step]:
    """``observe`` (the goal's ``world`` read back from the perception agent, once ``after`` ran)
    and ``confirm`` (``beats``' goal facts checked against it): the end of every goal's plan."""
    return [
        CrossAgentStep(
            id="observe",
            title="read the world back",
            target="perception",
            capability="FindSpatialContext",
            depends_on=[after],
            request={"entity_ids": ref("extract.entities[*].id"), "world": world},
        ),
        ToolStep(
            id="confirm",
            title="confirm the goal holds",
            tool="confirm_goal",
            depends_on=["observe"],
            input={"beats": beats, "facts": ref("observe.facts")},
        ),
    ]


def assignments_of(steps: list[Step]) -> list[Assignment]:
    """Who does each step: a cross-agent step's target, or the orchestrator itself."""
    return [
        Assignment(step=step.id, agent=step.target, capability=step.capability, purpose=step.title)
        if isinstance(step, CrossAgentStep)
        else Assignment(
            step=step.id, agent="orchestrator", capability="confirm_goal", purpose=step.title
        )
        for step in steps
    ]


class OrchestratorPlanner:
    """Plans ``SubmitGoal`` as cross-agent steps and a confirmation (see the module docstring)."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> OrchestrationPlan:
        """The plan for one goal.

        Raises:
            ValueError: For a capability this planner does not know.
        """
        if not isinstance(request, SubmitGoalRequest):
            raise ValueError(f"the orchestrator planner cannot plan {capability!r}")
        n = request.beats
        world = goal_world(request, plan_id)
        beat_ids = [f"beat_{i}" for i in range(1, n + 1)]
        steps: list[Step] = [
            CrossAgentStep(
                id="extract",
                title="extract entities and relations",
                target="perception",
                capability="ExtractEntities",
                request={"text": request.passage, "world": world, "require_facts": True},
            ),
            CrossAgentStep(
                id="spatial",
                title="find the entities' spatial context",
                target="perception",
                capability="FindSpatialContext",
                depends_on=["extract"],
                request={"entity_ids": ref("extract.entities[*].id"), "world": world},
            ),
            CrossAgentStep(
                id="analyze",
                title="analyse the narrative",
                target="strategic",
                capability="AnalyzeNarrative",
                depends_on=["extract"],
                request={"text": request.passage, "entities": ref("extract.entities")},
            ),
            CrossAgentStep(
                id="arc",
                title=f"plan a {n}-beat arc",
                target="strategic",
                capability="PlanNarrativeArc",
                depends_on=["analyze", "spatial"],
                request={
                    "goal": request.goal,
                    "protagonist": ref("analyze.protagonist"),
                    "themes": ref("analyze.themes"),
                    "facts": ref("spatial.facts"),
                    "beats": n,
                },
            ),
        ]
        for i, beat_id in enumerate(beat_ids):
            steps.append(
                CrossAgentStep(
                    id=beat_id,
                    title=f"action sequence for beat {i + 1}",
                    target="tactical",
                    capability="PlanExecutionSequence",
                    depends_on=["arc", "spatial"],
                    request={
                        "beat": ref(f"arc.beats[{i}]"),
                        "prior_beats": ref(f"arc.beats[0:{i}]"),
                        "facts": ref("spatial.facts"),
                        "max_depth": BEAT_MAX_DEPTH,
                    },
                )
            )
        steps.append(
            CrossAgentStep(
                id="apply",
                title="apply the final sequence to the world",
                target="perception",
                capability="UpdateWorldState",
                depends_on=beat_ids,
                request={"actions": ref(f"{beat_ids[-1]}.actions"), "world": world},
            )
        )
        steps += confirmation_steps("apply", ref("arc.beats"), world)
        return OrchestrationPlan(
            id=plan_id,
            owner="orchestrator",
            goal=request.goal,
            steps=steps,
            assignments=assignments_of(steps),
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The goal's outcome: beats, the applied sequence and the world-state change."""
        if not isinstance(request, SubmitGoalRequest):
            raise ValueError(f"the orchestrator planner cannot answer {capability!r}")
        beats = [Beat.model_validate(beat) for beat in result.outputs["arc"]["beats"]]
        return goal_response(
            request,
            result,
            beats=beats,
            last_beat=f"beat_{request.beats}",
            world=_world_of(result, request),
        )


def _world_of(result: PlanResult[Any], request: SubmitGoalRequest) -> str:
    """The world the plan's perception steps named (its plan id decided a fresh one)."""
    for step in result.submitted.steps:
        if isinstance(step, CrossAgentStep) and step.target == "perception":
            world = step.request.get("world")
            if isinstance(world, str) and world:
                return world
    return goal_world(request, result.submitted.id)


class OrchestratorAgent(RoleAgent):
    """The orchestrator: cross-agent plans, confirmed by its one tool (``confirm_goal``).

    Args:
        dispatcher: Sends the plan's cross-agent steps (needed to pursue any goal).
        engine_config: The engine's limits and seed.
        tracer_provider: Where spans go.
        store: Where its engine keeps plans durably.
    """

    spec = RoleSpec("orchestrator", OrchestrationPlan, OrchestratorPlanner, orchestrator_tools)
