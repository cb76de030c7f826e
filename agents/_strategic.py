"""The strategic agent: narrative analysis and arc planning (HTN-style templates).

Plans:

- ``AnalyzeNarrative``: ``protagonist`` (find_protagonist), ``themes`` (score_themes) and
  ``tension`` (measure_tension) in parallel, then ``summary`` (summarize_narrative).
- ``PlanNarrativeArc``: ``select`` (select_arc_template) -> ``decompose`` (decompose_goal), which
  yields exactly the number of beats asked for (see :mod:`agents._narrative`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._narrative import (
    THEME_LEXICONS,
    ArcChoice,
    ArcError,
    decompose,
    find_protagonist,
    measure_tension,
    score_themes,
    select_template,
)
from stratagem.agents._role import RoleAgent, RoleSpec
from stratagem.agents._tool import Tool, tool
from stratagem.planning import (
    LogicError,
    Plan,
    PlanResult,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    Beat,
    Entity,
    PlanNarrativeArcRequest,
    PlanNarrativeArcResponse,
    Relation,
    WireModel,
)

__all__ = [
    "DramaticBeat",
    "NarrativeGoal",
    "StrategicAgent",
    "StrategicPlan",
    "StrategicPlanner",
    "strategic_tools",
]


class NarrativeGoal(BaseModel):
    """A goal the story pursues.

    Attributes:
        text: The goal as written.
        protagonist: Who pursues it ("" until the analysis names someone).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    protagonist: str = ""


class DramaticBeat(BaseModel):
    """A beat the plan will produce: its slot in the arc (its goals come from the run).

    Attributes:
        id: The beat's id, ``beat_<index>``.
        index: Its position in the arc, from 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    index: int = Field(ge=1)


class StrategicPlan(Plan):
    """A strategic plan: the story's goals, its themes and its dramatic beats.

    Attributes:
        narrative_goals: The goals the story pursues.
        thematic_elements: The themes considered (given by the request, or the lexicon's themes).
        dramatic_beats: The beats the arc will have.
    """

    narrative_goals: list[NarrativeGoal] = Field(default_factory=list)
    thematic_elements: list[str] = Field(default_factory=list)
    dramatic_beats: list[DramaticBeat] = Field(default_factory=list)


# --- tools -------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Protagonist(_Out):
    """Who the story is about (an entity id, "" when it names no one)."""

    protagonist: str


class Themes(_Out):
    """Themes by score, highest first."""

    themes: list[str]
    scores: dict[str, int]


class Tension(_Out):
    """The passage's tension in [0, 1]."""

    tension: float


class Summary(_Out):
    """A one-line summary of the analysis."""

    summary: str


class Arc(_Out):
    """The arc: its template and its beats."""

    template: str
    beats: list[Beat]


@tool(name="find_protagonist")
async def find_protagonist_tool(text: str, entities: list[Entity]) -> Protagonist:
    """The most-mentioned character (ties: the first to appear)."""
    return Protagonist(protagonist=find_protagonist(text, entities))


@tool(name="score_themes")
async def score_themes_tool(text: str) -> Themes:
    """Score the passage against the theme lexicons."""
    ranked = score_themes(text)
    return Themes(themes=[name for name, _ in ranked], scores=dict(ranked))


@tool(name="measure_tension")
async def measure_tension_tool(text: str) -> Tension:
    """Measure the passage's tension from its tension words per sentence."""
    return Tension(tension=measure_tension(text))


@tool
async def summarize_narrative(protagonist: str, themes: list[str], tension: float) -> Summary:
    """Summarise the analysis in one line."""
    who = protagonist or "no one in particular"
    about = ", ".join(themes) if themes else "no clear theme"
    return Summary(summary=f"A story about {who}; themes: {about}; tension {tension:.2f}.")


@tool
async def select_arc_template(goal: str, protagonist: str, facts: list[Relation]) -> ArcChoice:
    """Choose the arc template for the goal and bind its entities from the facts."""
    try:
        return select_template(goal, protagonist, facts)
    except ArcError as exc:
        raise LogicError(str(exc)) from exc


@tool
async def decompose_goal(choice: ArcChoice, beats: int) -> Arc:
    """Decompose the goal with the chosen template into exactly ``beats`` beats."""
    try:
        return Arc(template=choice.template, beats=decompose(choice, beats))
    except ArcError as exc:
        raise LogicError(str(exc)) from exc


def strategic_tools() -> list[Tool[Any, Any]]:
    """The strategic tools (stateless, shared by every strategic agent)."""
    return [
        find_protagonist_tool,
        score_themes_tool,
        measure_tension_tool,
        summarize_narrative,
        select_arc_template,
        decompose_goal,
    ]


# --- the planner -------------------------------------------------------------------------------


class StrategicPlanner:
    """Plans the strategic capabilities with the agent's tools."""

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> StrategicPlan:
        """The plan for one strategic request (see the module docstring).

        Raises:
            ValueError: For a capability this planner does not know.
        """
        if isinstance(request, AnalyzeNarrativeRequest):
            entities = [e.model_dump() for e in request.entities]
            return StrategicPlan(
                id=plan_id,
                owner="strategic",
                goal="analyse a passage: protagonist, themes, tension",
                thematic_elements=list(THEME_LEXICONS),
                steps=[
                    ToolStep(
                        id="protagonist",
                        tool="find_protagonist",
                        input={"text": request.text, "entities": entities},
                    ),
                    ToolStep(id="themes", tool="score_themes", input={"text": request.text}),
                    ToolStep(id="tension", tool="measure_tension", input={"text": request.text}),
                    ToolStep(
                        id="summary",
                        tool="summarize_narrative",
                        depends_on=["protagonist", "themes", "tension"],
                        input={
                            "protagonist": ref("protagonist.protagonist"),
                            "themes": ref("themes.themes"),
                            "tension": ref("tension.tension"),
                        },
                    ),
                ],
            )
        if isinstance(request, PlanNarrativeArcRequest):
            return StrategicPlan(
                id=plan_id,
                owner="strategic",
                goal=f"plan a {request.beats}-beat arc: {request.goal}",
                narrative_goals=[NarrativeGoal(text=request.goal, protagonist=request.protagonist)],
                thematic_elements=list(request.themes),
                dramatic_beats=[
                    DramaticBeat(id=f"beat_{i}", index=i) for i in range(1, request.beats + 1)
                ],
                steps=[
                    ToolStep(
                        id="select",
                        tool="select_arc_template",
                        input={
                            "goal": request.goal,
                            "protagonist": request.protagonist,
                            "facts": [f.model_dump() for f in request.facts],
                        },
                    ),
                    ToolStep(
                        id="decompose",
                        tool="decompose_goal",
                        depends_on=["select"],
                        input={"choice": ref("select"), "beats": request.beats},
                    ),
                ],
            )
        raise ValueError(f"the strategic planner cannot plan {capability!r}")

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The response, from the plan's outputs."""
        out = result.outputs
        if isinstance(request, AnalyzeNarrativeRequest):
            return AnalyzeNarrativeResponse(
                protagonist=out["protagonist"]["protagonist"],
                themes=out["themes"]["themes"],
                tension=out["tension"]["tension"],
                summary=out["summary"]["summary"],
            )
        if isinstance(request, PlanNarrativeArcRequest):
            return PlanNarrativeArcResponse(
                template=out["decompose"]["template"], beats=out["decompose"]["beats"]
            )
        raise ValueError(f"the strategic planner cannot answer {capability!r}")


class StrategicAgent(RoleAgent):
    """The strategic agent: narrative analysis and arc decomposition.

    Args:
        dispatcher: Sends cross-agent steps (built-in strategic plans have none).
        engine_config: The engine's limits and seed.
        tracer_provider: Where spans go.
        store: Where its engine keeps plans durably.
    """

    spec = RoleSpec("strategic", StrategicPlan, StrategicPlanner, strategic_tools)
