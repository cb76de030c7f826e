"""The orchestrator: pursues a story goal by assigning work to the other agents.

It has no tools; its plans are cross-agent steps only. ``SubmitGoal(goal, passage, beats=N)``:

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
=============  ============================================  =====================================

Every beat is planned cumulatively from the opening state: beat *i*'s sequence reaches beat *i*'s
goals and every earlier beat's. The last beat's sequence therefore reaches every beat's goals, and
it alone is applied; the other beats' sequences show that each stage is reachable on its own (and
run in parallel). The arc's templates only use goals that later beats keep, so the cumulative goals
are always consistent.

A goal that already holds in the passage yields an empty final sequence; ``apply`` then changes
nothing and the goal succeeds with no actions.

A passage of several paragraphs (separated by a blank line) is extracted paragraph by paragraph:
``extract`` is then a map of ``ExtractEntities`` over the paragraphs (one at a time, so the world
merges them in the passage's order, as it would one text), and the steps after it read the
entities of every paragraph (``extract.items[].entities[]``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._role import RoleAgent, RoleSpec
from stratagem.planning import (
    CrossAgentStep,
    MapStep,
    Plan,
    PlanResult,
    Step,
    expr,
    ref,
)
from stratagem.protocol import SubmitGoalRequest, SubmitGoalResponse, WireModel

__all__ = [
    "Assignment",
    "OrchestrationPlan",
    "OrchestratorAgent",
    "OrchestratorPlanner",
]

BEAT_MAX_DEPTH = 16
"""The longest action sequence the tactical agent searches for, per beat."""


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


def extraction(passage: str) -> Extraction:
    """The ``extract`` step of a goal's plan: the passage in one request, or, for a passage of
    several paragraphs, a map over them (see the module docstring)."""
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
                request={"text": passage},
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
            request={"text": expr("item")},
        ),
        inputs={"paragraphs": paragraphs},
        entities=expr("extract.items[].entities[]"),
        entity_ids=expr("extract.items[].entities[].id"),
    )


def assignments(steps: list[Step]) -> list[Assignment]:
    """Who does what: one assignment per step that asks an agent."""
    return [
        Assignment(step=step.id, agent=step.target, capability=step.capability, purpose=step.title)
        for step in steps
        if isinstance(step, CrossAgentStep | MapStep)
        and step.target is not None
        and step.capability is not None
    ]


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


class OrchestratorPlanner:
    """Plans ``SubmitGoal`` as cross-agent steps (see the module docstring)."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> OrchestrationPlan:
        """The plan for one goal.

        Raises:
            ValueError: For a capability this planner does not know.
        """
        if not isinstance(request, SubmitGoalRequest):
            raise ValueError(f"the orchestrator planner cannot plan {capability!r}")
        n = request.beats
        beat_ids = [f"beat_{i}" for i in range(1, n + 1)]
        extract = extraction(request.passage)
        steps: list[Step] = [
            extract.step,
            CrossAgentStep(
                id="spatial",
                title="find the entities' spatial context",
                target="perception",
                capability="FindSpatialContext",
                depends_on=["extract"],
                request={"entity_ids": extract.entity_ids},
            ),
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
        steps.append(
            CrossAgentStep(
                id="apply",
                title="apply the final sequence to the world",
                target="perception",
                capability="UpdateWorldState",
                depends_on=beat_ids,
                request={"actions": ref(f"{beat_ids[-1]}.actions")},
            )
        )
        return OrchestrationPlan(
            id=plan_id,
            owner="orchestrator",
            goal=request.goal,
            steps=steps,
            inputs=extract.inputs,
            assignments=assignments(steps),
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The goal's outcome: beats, the applied sequence and the world-state change."""
        if not isinstance(request, SubmitGoalRequest):
            raise ValueError(f"the orchestrator planner cannot answer {capability!r}")
        out = result.outputs
        return SubmitGoalResponse(
            plan_id=result.submitted.id,
            status=result.status.value,
            beats=out["arc"]["beats"],
            actions=out[f"beat_{request.beats}"]["actions"],
            added=out["apply"]["added"],
            removed=out["apply"]["removed"],
        )


class OrchestratorAgent(RoleAgent):
    """The orchestrator: no tools, only cross-agent plans.

    Args:
        dispatcher: Sends the plan's cross-agent steps (needed to pursue any goal).
        engine_config: The engine's limits and seed.
        tracer_provider: Where spans go.
        store: Where its engine keeps plans durably.
    """

    spec = RoleSpec("orchestrator", OrchestrationPlan, OrchestratorPlanner)
