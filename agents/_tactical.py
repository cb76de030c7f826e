"""The tactical agent: finds a sequence of world actions that reaches a beat's goals.

One plan per ``PlanExecutionSequence`` request: ``ground`` (ground_actions: the actors and every
ground action open to them) -> ``search`` (search_sequence: A* to a state where the beat's goals and
every prior beat's goals hold, bounded by ``max_depth`` and a node cap) -> ``verify``
(verify_sequence: re-simulate the sequence from the opening facts). The actions returned carry their
preconditions, adds and deletes, so the perception agent can apply them as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._actions import GroundAction, actors_for, ground_actions, search, simulate
from stratagem.agents._agent import Agent
from stratagem.agents._role import AgentOptions, AgentRole, RoleSpec, compose_agent
from stratagem.agents._tool import Tool, in_thread, tool
from stratagem.agents._world import format_fact
from stratagem.planning import (
    LogicError,
    Plan,
    PlanResult,
    StepFailure,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    Action,
    Beat,
    PlanExecutionSequenceRequest,
    PlanExecutionSequenceResponse,
    Relation,
    WireModel,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DEFAULT_NODE_CAP",
    "TACTICAL_SPEC",
    "ResourceRequirements",
    "TacticalAgent",
    "TacticalPlan",
    "TacticalPlanner",
    "TacticalStep",
    "goals_of",
    "tactical_tools",
]

DEFAULT_NODE_CAP = 20_000
# A replan after an exhausted search multiplies its node cap by this, up to MAX_NODE_CAP.
NODE_CAP_GROWTH = 4
MAX_NODE_CAP = 400_000
"""The most world states one search expands."""


class TacticalStep(BaseModel):
    """One stage of a tactical plan.

    Attributes:
        step: The plan step that performs it.
        purpose: What it establishes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    purpose: str


class ResourceRequirements(BaseModel):
    """What a tactical plan needs.

    Attributes:
        actors: The characters who act.
        goals: The goal facts the sequence must reach.
        max_depth: The longest action sequence considered.
        node_cap: The most world states the search may expand.
        cost_units: The cost of the plan's tool calls.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    actors: list[str] = Field(default_factory=list)
    goals: list[Relation] = Field(default_factory=list)
    max_depth: int = 12
    node_cap: int = DEFAULT_NODE_CAP
    cost_units: float = 0.0


class TacticalPlan(Plan):
    """A tactical plan: its execution steps, their dependencies and its resource needs.

    Attributes:
        execution_steps: The stages of the plan, in order.
        dependencies: Step id -> the steps it waits for.
        resource_requirements: Actors, goals and search bounds.
    """

    # What the planner decided, for the record: nothing runs these in a user's plan.
    planner_fields: ClassVar[frozenset[str]] = frozenset(
        {"execution_steps", "dependencies", "resource_requirements"}
    )

    execution_steps: list[TacticalStep] = Field(default_factory=list)
    dependencies: dict[str, list[str]] = Field(default_factory=dict)
    resource_requirements: ResourceRequirements = Field(default_factory=ResourceRequirements)


def goals_of(beat: Beat, prior_beats: Sequence[Beat]) -> list[Relation]:
    """The facts a beat's sequence must reach: every prior beat's goals, then the beat's own."""
    return list(dict.fromkeys(g for b in [*prior_beats, beat] for g in b.goals))


def _describe(goals: Sequence[Relation]) -> str:
    return ", ".join(format_fact(g) for g in goals)


# --- tools -------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Grounded(_Out):
    """The ground actions open to the actors."""

    actors: list[str]
    actions: list[Action]


class Found(_Out):
    """The action sequence a search found."""

    actions: list[Action]
    states_explored: int


class Verified(_Out):
    """A sequence that re-simulates cleanly and reaches its goals."""

    ok: bool
    steps: int


@tool(name="ground_actions")
async def ground_actions_tool(facts: list[Relation], goals: list[Relation]) -> Grounded:
    """Ground every action open to the goals' actors over the opening facts."""
    actors = actors_for(facts, goals)
    return Grounded(actors=actors, actions=[g.action for g in ground_actions(facts, actors)])


@tool
async def search_sequence(
    facts: list[Relation],
    goals: list[Relation],
    actions: list[Action],
    max_depth: int = 12,
    node_cap: int = DEFAULT_NODE_CAP,
) -> Found:
    """A* search for a shortest action sequence that reaches every goal fact."""
    # A large search takes a while: off the event loop, so the agent keeps serving, and stopped
    # when this step is cancelled (a deadline, a step timeout, a cancelled plan).
    outcome = await in_thread(
        functools.partial(
            search,
            facts,
            goals,
            max_depth=max_depth,
            node_cap=node_cap,
            actions=[GroundAction.from_action(a) for a in actions],
        )
    )
    if outcome.actions is None:
        limit = f"{node_cap} states" if outcome.exhausted else f"{max_depth} steps"
        raise LogicError(f"no action sequence reaches {_describe(goals)} within {limit}")
    return Found(actions=outcome.actions, states_explored=outcome.explored)


@tool
async def verify_sequence(
    facts: list[Relation], actions: list[Action], goals: list[Relation]
) -> Verified:
    """Re-simulate the sequence from the opening facts and check every goal holds at the end."""
    simulation = simulate(facts, actions, goals)
    if simulation.error:
        raise LogicError(f"the sequence does not re-simulate: {simulation.error}")
    if simulation.unmet:
        raise LogicError(f"the sequence does not reach {_describe(simulation.unmet)}")
    return Verified(ok=True, steps=len(actions))


def tactical_tools() -> list[Tool[Any, Any]]:
    """The tactical tools (stateless, shared by every tactical agent)."""
    return [ground_actions_tool, search_sequence, verify_sequence]


# --- the planner -------------------------------------------------------------------------------


class TacticalPlanner:
    """Plans ``PlanExecutionSequence`` with the agent's tools.

    Args:
        node_cap: The most world states one search may expand.
    """

    def __init__(self, node_cap: int = DEFAULT_NODE_CAP) -> None:
        self.node_cap = node_cap

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> TacticalPlan:
        """The plan for one tactical request (see the module docstring).

        Raises:
            ValueError: For a capability this planner does not know.
        """
        if not isinstance(request, PlanExecutionSequenceRequest):
            raise ValueError(f"the tactical planner cannot plan {capability!r}")
        goals = goals_of(request.beat, request.prior_beats)
        facts = [f.model_dump() for f in request.facts]
        goal_data = [g.model_dump() for g in goals]
        steps = [
            ToolStep(
                id="ground", tool="ground_actions", input={"facts": facts, "goals": goal_data}
            ),
            ToolStep(
                id="search",
                tool="search_sequence",
                depends_on=["ground"],
                input={
                    "facts": facts,
                    "goals": goal_data,
                    "actions": ref("ground.actions"),
                    "max_depth": request.max_depth,
                    "node_cap": self.node_cap,
                },
            ),
            ToolStep(
                id="verify",
                tool="verify_sequence",
                depends_on=["search"],
                input={"facts": facts, "actions": ref("search.actions"), "goals": goal_data},
            ),
        ]
        return TacticalPlan(
            id=plan_id,
            owner="tactical",
            goal=f"reach {request.beat.id}: {_describe(goals)}"[:2000],
            steps=steps,
            execution_steps=[
                TacticalStep(step="ground", purpose="ground the actions open to the actors"),
                TacticalStep(step="search", purpose=f"reach {_describe(goals)}"[:500]),
                TacticalStep(step="verify", purpose="re-simulate the sequence"),
            ],
            dependencies={step.id: list(step.depends_on) for step in steps},
            resource_requirements=ResourceRequirements(
                actors=actors_for(request.facts, goals),
                goals=goals,
                max_depth=request.max_depth,
                node_cap=self.node_cap,
                cost_units=float(len(steps)),
            ),
        )

    def replan(self, plan: Plan, failure: StepFailure) -> Plan | None:
        """After a logic failure: give a search that ran out of states a larger node cap.

        The node cap is this agent's own bound on work, so it may grow (by ``NODE_CAP_GROWTH``, up
        to ``MAX_NODE_CAP``); the request's ``max_depth`` is the caller's and is never exceeded,
        and other failures (no sequence within the depth, a failed verification) are final.
        """
        search = next((s for s in plan.steps if s.id == "search"), None)
        if failure.step_id != "search" or not isinstance(search, ToolStep):
            return None
        cap = int(search.input.get("node_cap", self.node_cap))
        if f"within {cap} states" not in failure.message or cap >= MAX_NODE_CAP:
            return None
        bigger = min(cap * NODE_CAP_GROWTH, MAX_NODE_CAP)
        steps = [
            step.model_copy(update={"input": {**step.input, "node_cap": bigger}})
            if step is search
            else step
            for step in plan.steps
        ]
        update: dict[str, Any] = {"steps": steps}
        if isinstance(plan, TacticalPlan):
            update["resource_requirements"] = plan.resource_requirements.model_copy(
                update={"node_cap": bigger}
            )
        return plan.model_copy(update=update)

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The response, from the plan's outputs."""
        if not isinstance(request, PlanExecutionSequenceRequest):
            raise ValueError(f"the tactical planner cannot answer {capability!r}")
        found = result.outputs.get("search")
        if found is None:  # a model's sequence, re-simulated by its verify step: no search ran
            verify = result.plan.step("verify")
            actions = verify.input["actions"] if isinstance(verify, ToolStep) else []
            return PlanExecutionSequenceResponse(
                beat_id=request.beat.id, actions=actions, states_explored=0
            )
        return PlanExecutionSequenceResponse(
            beat_id=request.beat.id,
            actions=found["actions"],
            states_explored=found["states_explored"],
        )


TACTICAL_SPEC = RoleSpec("tactical", TacticalPlan, TacticalPlanner, tactical_tools)
"""The tactical role: goal-directed search over world actions (its plans have no cross-agent
steps)."""


def _tactical_agent(*, node_cap: int = DEFAULT_NODE_CAP, **options: Unpack[AgentOptions]) -> Agent:
    """The tactical agent; ``node_cap``: the most world states one search may expand."""
    return compose_agent(TACTICAL_SPEC, planner=TacticalPlanner(node_cap), **options)


TacticalAgent: Final = AgentRole("TacticalAgent", TACTICAL_SPEC, _tactical_agent)
"""Builds the tactical agent: ``TacticalAgent(node_cap=, dispatcher=, engine_config=,
tracer_provider=, store=)``."""
