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

A goal that names external A2A agents to consult (``consult``) has a ``consult_<name>`` step for
each once the arc is planned, best effort unless ``consult_required`` (``_consult.py``); the
answer's ``consultations`` say what each answered.

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

A passage of several paragraphs (separated by a blank line) is extracted paragraph by paragraph:
``extract`` is then a map of ``ExtractEntities`` over the paragraphs (one at a time, so the world
merges them in the passage's order, as it would one text), and the steps after it read the
entities of every paragraph (``extract.items[].entities[]``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict

from stratagem.agents._agent import Agent, Prepare
from stratagem.agents._consult import (
    check_consulted,
    consultation_steps,
    consultations_of,
    required_consultations,
    waive_consultation,
)
from stratagem.agents._goals import GOAL_REPLANNED, GoalPlanner, show_goal_plan
from stratagem.agents._orchestration import Assignment, OrchestrationPlan
from stratagem.agents._role import AgentOptions, AgentRole, RoleSpec, compose_agent
from stratagem.agents._tool import Tool, tool
from stratagem.planning import (
    CrossAgentStep,
    LogicError,
    MapStep,
    Plan,
    PlanResult,
    Step,
    StepFailure,
    ToolStep,
    expr,
    ref,
)
from stratagem.protocol import (
    ALREADY_HOLDS,
    AskGoalRequest,
    Beat,
    Relation,
    SubmitGoalRequest,
    SubmitGoalResponse,
    WireModel,
)
from stratagem.protocol._a2a._client import A2ASkill

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ORCHESTRATOR_SPEC",
    "Assignment",
    "OrchestrationPlan",
    "OrchestratorAgent",
    "OrchestratorPlanner",
    "confirmation_steps",
    "goal_response",
    "goal_world",
    "orchestrator_tools",
]

Skills = Callable[[], Awaitable[Mapping[str, Sequence[A2ASkill]]]]
"""What the orchestrator reads the external A2A agents' skills with (``A2ADispatcher.skills``)."""

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
        consultations=consultations_of(result),
    )


MAX_PARAGRAPHS = 16
"""The most paragraphs a passage is extracted in (the rest go with the last)."""


class Extraction(BaseModel):
    """How a goal's passage is extracted: the ``extract`` step and what later steps read of it.

    Attributes:
        step: ``extract``: one request, or a map over the paragraphs.
        inputs: The plan's inputs the step reads (the paragraphs, for a map).
        entities: The extracted entities, as a reference or an expression.
        entity_ids: Their ids.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    step: CrossAgentStep | MapStep
    inputs: dict[str, Any]
    entities: dict[str, str]
    entity_ids: dict[str, str]


def spatial_step(extract: Extraction, world: str) -> CrossAgentStep:
    """The ``spatial`` step of a goal's plan: the extracted entities' spatial context in
    ``world``."""
    return CrossAgentStep(
        id="spatial",
        title="find the entities' spatial context",
        target="perception",
        capability="FindSpatialContext",
        depends_on=["extract"],
        request={"entity_ids": extract.entity_ids, "world": world},
    )


def extraction(passage: str, world: str) -> Extraction:
    """The ``extract`` step of a goal's plan (in ``world``): the passage in one request (whose
    sentences must read as facts), or, for a passage of several paragraphs, a map over them (a
    paragraph may hold none; ``spatial`` then needs some entity of any)."""
    paragraphs = [" ".join(part.split()) for part in passage.split("\n\n") if part.strip()]
    if len(paragraphs) > MAX_PARAGRAPHS:
        paragraphs[MAX_PARAGRAPHS - 1 :] = [" ".join(paragraphs[MAX_PARAGRAPHS - 1 :])]
    if len(paragraphs) <= 1:
        return Extraction(
            step=CrossAgentStep(
                id="extract",
                title="extract entities and relations",
                target="perception",
                capability="ExtractEntities",
                request={"text": passage, "world": world, "require_facts": True},
            ),
            inputs={},
            entities=ref("extract.entities"),
            entity_ids=ref("extract.entities[*].id"),
        )
    return Extraction(
        step=MapStep(
            id="extract",
            title=f"extract entities and relations from {len(paragraphs)} paragraphs",
            over="inputs.paragraphs",
            max_items=MAX_PARAGRAPHS,
            max_parallel=1,
            target="perception",
            capability="ExtractEntities",
            request={"text": expr("item"), "world": world},
        ),
        inputs={"paragraphs": paragraphs},
        entities=expr("extract.items[].entities[]"),
        entity_ids=expr("extract.items[].entities[].id"),
    )


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
    """The orchestrator's tools: ``confirm_goal`` (it reads), ``waive_consultation`` (a failed
    consultation's route) and ``show_goal_plan`` (a plan-only goal's); they change nothing."""
    return [confirm_goal, waive_consultation, show_goal_plan]


def confirmation_steps(
    after: str, beats: Any, world: str, entity_ids: dict[str, str] | None = None
) -> list[Step]:
    """``observe`` (the goal's ``world`` read back from the perception agent, once ``after`` ran)
    and ``confirm`` (``beats``' goal facts checked against it): the end of every goal's plan.
    ``entity_ids``: what ``extract`` found (``Extraction.entity_ids``; one request's by default).
    """
    return [
        CrossAgentStep(
            id="observe",
            title="read the world back",
            target="perception",
            capability="FindSpatialContext",
            depends_on=[after],
            request={
                "entity_ids": entity_ids or ref("extract.entities[*].id"),
                "world": world,
            },
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
    """Who does each step: a cross-agent step's (or a map's) target, or the orchestrator."""
    return [
        Assignment(step=step.id, agent=step.target, capability=step.capability, purpose=step.title)
        if isinstance(step, CrossAgentStep | MapStep)
        and step.target is not None
        and step.capability is not None
        else Assignment(
            step=step.id,
            agent="orchestrator",
            capability=step.tool if isinstance(step, ToolStep) else step.kind,
            purpose=step.title,
        )
        for step in steps
    ]


class OrchestratorPlanner:
    """Plans ``SubmitGoal`` as cross-agent steps and a confirmation (see the module docstring).

    Args:
        a2a_agents: The external A2A agents a goal may consult, by name (those the agent's
            dispatcher reaches: ``STRATAGEM_A2A_AGENTS``).
    """

    failure_classes = GOAL_REPLANNED
    """A goal's step that stays failed after its retries (``transient``, ``timeout``) or that a
    rule refused (``policy``) is planned around like one its agent refused (``logic``)."""

    def __init__(self, a2a_agents: Collection[str] = ()) -> None:
        self.a2a_agents = frozenset(a2a_agents)
        self.goals = GoalPlanner()

    def consulted(self, request: SubmitGoalRequest) -> list[str]:
        """The external agents ``request`` consults.

        Raises:
            protocol.InvalidArgumentError: One that is not among ``a2a_agents``.
        """
        return check_consulted(request, self.a2a_agents)

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> OrchestrationPlan:
        """The plan for one goal, consulting every external agent it names.

        Raises:
            ValueError: For a capability this planner does not know.
            protocol.InvalidArgumentError: The goal consults an agent this planner does not know.
        """
        if isinstance(request, AskGoalRequest):
            return self.goals.plan(request, plan_id=plan_id)
        if not isinstance(request, SubmitGoalRequest):
            raise ValueError(f"the orchestrator planner cannot plan {capability!r}")
        return self.goal_plan(request, plan_id=plan_id, consult=self.consulted(request))

    def goal_plan(
        self, request: SubmitGoalRequest, *, plan_id: str, consult: list[str]
    ) -> OrchestrationPlan:
        """The built-in pipeline for ``request``, consulting the external agents ``consult``
        (checked by the caller) once the arc is planned."""
        n = request.beats
        world = goal_world(request, plan_id)
        beat_ids = [f"beat_{i}" for i in range(1, n + 1)]
        extract = extraction(request.passage, world)
        steps: list[Step] = [
            extract.step,
            spatial_step(extract, world),
            CrossAgentStep(
                id="analyze",
                title="analyse the narrative",
                target="strategic",
                capability="AnalyzeNarrative",
                depends_on=["extract"],
                request={"text": request.passage, "entities": extract.entities},
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
        consulting = consultation_steps(
            request, consult, after=["arc"], beats=ref("arc.beats"), world=world
        )
        steps += consulting
        steps.append(
            CrossAgentStep(
                id="apply",
                title="apply the final sequence to the world",
                target="perception",
                capability="UpdateWorldState",
                depends_on=beat_ids + required_consultations(request, consulting),
                request={"actions": ref(f"{beat_ids[-1]}.actions"), "world": world},
            )
        )
        steps += confirmation_steps("apply", ref("arc.beats"), world, extract.entity_ids)
        return OrchestrationPlan(
            id=plan_id,
            owner="orchestrator",
            goal=request.goal,
            steps=steps,
            inputs=extract.inputs,
            assignments=assignments_of(steps),
        )

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        """A goal in plain words' next revision after a step failed for good, whatever its class
        but ``cancelled`` (``GoalPlanner.replan``); a story goal's plan is not
        replanned."""
        if isinstance(plan, OrchestrationPlan) and any(
            a.score is not None for a in plan.assignments
        ):
            return self.goals.replan(plan, failure)
        return None

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The goal's outcome: beats, the applied sequence and the world-state change."""
        if isinstance(request, AskGoalRequest):
            return self.goals.respond(request, result)
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
        if isinstance(step, CrossAgentStep | MapStep) and step.target == "perception":
            world = step.request.get("world")
            if isinstance(world, str) and world:
                return world
    return goal_world(request, result.submitted.id)


ORCHESTRATOR_SPEC = RoleSpec(
    "orchestrator", OrchestrationPlan, OrchestratorPlanner, orchestrator_tools
)
"""The orchestrator role: cross-agent plans, confirmed by its tool ``confirm_goal``."""


def _orchestrator_agent(
    *, a2a_agents: Collection[str] = (), **options: Unpack[AgentOptions]
) -> Agent:
    """The orchestrator.

    Args:
        a2a_agents: The external A2A agents a goal may consult, by name.
        **options: What every role's agent takes (``AgentOptions``); its ``dispatcher`` sends the
            plan's cross-agent steps (needed to pursue any goal), and for goals that consult
            external A2A agents, ``a2a`` steps (``runtime.A2ADispatcher``).
    """
    # The external A2A agents' skills (their cards' examples) a goal in plain words may use.
    dispatcher = options.get("dispatcher")
    skills: Skills | None = getattr(dispatcher, "skills", None) if a2a_agents else None
    return compose_agent(
        ORCHESTRATOR_SPEC,
        planner=OrchestratorPlanner(a2a_agents),
        prepare=_preparing(skills),
        **options,
    )


OrchestratorAgent: Final = AgentRole("OrchestratorAgent", ORCHESTRATOR_SPEC, _orchestrator_agent)
"""Builds the orchestrator: ``OrchestratorAgent(a2a_agents=, dispatcher=, engine_config=,
tracer_provider=, store=)``."""


def _preparing(skills: Skills | None) -> Prepare:
    """The orchestrator's step before serving a goal in plain words: a policy that says so
    (``[goals] approve_side_effects``) makes it wait for an approval before its steps that have
    side effects, and the external A2A agents' cards are read (once each) so that their skills
    are in the capability directory."""

    async def prepare(agent: Agent, request: WireModel) -> WireModel:
        if not isinstance(request, AskGoalRequest):
            return request
        policy = agent.policy
        if not request.approve and policy is not None and policy.approve_goal_side_effects:
            request = request.model_copy(update={"approve": True})
        if skills is None:
            return request
        # A model planner's fallback is the orchestrator's own planner: its goals are the same.
        own = getattr(agent.planner, "deterministic", agent.planner)
        if isinstance(own, OrchestratorPlanner):
            own.goals.use_external(await skills())
        return request

    return prepare
