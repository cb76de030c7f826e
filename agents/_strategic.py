"""The strategic agent: narrative analysis and arc planning (HTN-style templates).

Plans:

- ``AnalyzeNarrative``: ``protagonist`` (find_protagonist), ``themes`` (score_themes) and
  ``tension`` (measure_tension) in parallel, then ``summary`` (summarize_narrative).
- ``PlanNarrativeArc``: ``select`` (select_arc_template) -> ``decompose`` (decompose_goal), which
  yields exactly the number of beats asked for (see :mod:`agents._narrative`). Beats proposed by
  someone else (a model) are checked by ``check_arc`` (``arc_problems``): the plan is then one step,
  ``decompose`` (check_arc), whose output is the arc.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

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
from stratagem.agents._role import AgentRole, RoleSpec, role_builder
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
    "SIGNATURES",
    "STRATEGIC_SPEC",
    "DramaticBeat",
    "NarrativeGoal",
    "StrategicAgent",
    "StrategicPlan",
    "StrategicPlanner",
    "arc_problems",
    "kinds_from_facts",
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

    # What the planner decided, for the record: nothing runs these in a user's plan.
    planner_fields: ClassVar[frozenset[str]] = frozenset(
        {"narrative_goals", "thematic_elements", "dramatic_beats"}
    )

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


# Facts of which an entity has one at a time: a later beat must not contradict an earlier one.
_SINGLE_VALUED: dict[str, int] = {"at": 0, "in": 0, "has": 2}
"""Predicate -> which side is unique: 0 the subject (mira is at one place, the key in one place),
2 the object (one character has the key)."""

SIGNATURES: dict[str, tuple[str, str]] = {
    "at": ("character", "place"),
    "in": ("object", "place"),
    "has": ("character", "object"),
    "connected": ("place", "place"),
    "locked": ("place", "place"),
    "opens": ("object", "place"),
    "knows": ("character", "character"),
    "wants": ("character", "object"),
}
"""What each predicate relates: the kinds of its subject and object."""


def with_article(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def kinds_from_facts(facts: list[Relation]) -> dict[str, set[str]]:
    """The kinds the facts give each entity (``mira at courtyard``: a character, a place)."""
    kinds: dict[str, set[str]] = {}
    for fact in facts:
        subject, obj = SIGNATURES.get(fact.predicate, ("", ""))
        if subject:
            kinds.setdefault(fact.subject, set()).add(subject)
            kinds.setdefault(fact.object, set()).add(obj)
    return kinds


def arc_problems(
    beats: list[Beat], facts: list[Relation], protagonist: str, goal: str = ""
) -> list[str]:
    """What keeps ``beats`` from being an arc to plan cumulatively (``[]``: nothing).

    Every goal names entities the facts know (or the protagonist), of the kinds its predicate
    relates (``in``: an object in a place), and two different ones unless it is ``locked``; every
    beat after the first adds a goal that neither holds already nor was an earlier beat's (an
    opening beat may restate what holds, as a template's does); the goals accumulated over the
    beats never place an entity twice (at or in two places, an object held by two characters);
    the protagonist, when there is one, takes part in some goal; and when ``goal`` names entities
    of the world (their words in its text), the last beat's goals involve one of them.
    """
    known = {f.subject for f in facts} | {f.object for f in facts}
    if protagonist:
        known.add(protagonist)
    kinds = kinds_from_facts(facts)
    holding = {(f.subject, f.predicate, f.object) for f in facts}
    problems: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    placed: dict[tuple[str, str], tuple[str, str]] = {}
    for index, beat in enumerate(beats):
        new = False
        for fact in beat.goals:
            triple = (fact.subject, fact.predicate, fact.object)
            shown = f"{fact.predicate}({fact.subject}, {fact.object})"
            unknown = [name for name in (fact.subject, fact.object) if name not in known]
            if unknown:
                problems.append(
                    f"{beat.id}: {shown} names {', '.join(unknown)}, which the world does not know"
                )
                continue
            if fact.subject == fact.object and fact.predicate != "locked":
                problems.append(f"{beat.id}: {shown} relates {fact.subject} to itself")
                continue
            wrong = [
                f"{name} is not {with_article(kind)}"
                for name, kind in zip(triple[::2], SIGNATURES[fact.predicate], strict=True)
                if kinds.get(name) and kind not in kinds[name]
            ]
            if wrong:
                problems.append(f"{beat.id}: {shown}: {'; '.join(wrong)}")
                continue
            new = new or (triple not in holding and triple not in seen)
            seen.add(triple)
            side = _SINGLE_VALUED.get(fact.predicate)
            if side is not None:
                key = (fact.predicate, triple[side])
                other = placed.setdefault(key, (beat.id, shown))
                if other[1] != shown:
                    problems.append(
                        f"{beat.id}: {shown} contradicts {other[0]}'s {other[1]} (goals accumulate)"
                    )
        if index > 0 and not new:
            problems.append(f"{beat.id} adds no goal: each holds already or is an earlier beat's")
    if beats and not any(t not in holding for t in seen) and not problems:
        problems.append("every goal already holds: the arc changes nothing")
    if protagonist and not any(protagonist in (s, o) for s, _, o in seen):
        problems.append(f"no beat's goals involve the protagonist {protagonist}")
    words = set(goal.lower().replace("'", " ").split())
    named = {e for e in known - {protagonist} if set(e.split("_")) <= words}
    if beats and named and not any(named & {g.subject, g.object} for g in beats[-1].goals):
        names = ", ".join(sorted(named))
        problems.append(f"the last beat's goals involve none of what the goal names ({names})")
    return problems


@tool
async def check_arc(
    beats: list[Beat], facts: list[Relation], protagonist: str = "", goal: str = ""
) -> Arc:
    """Check beats proposed for a goal (``arc_problems``) and return them as the arc."""
    problems = arc_problems(beats, facts, protagonist, goal)
    if problems:
        raise LogicError("the proposed beats are not an arc: " + "; ".join(problems[:6]))
    return Arc(template="proposed", beats=beats)


def strategic_tools() -> list[Tool[Any, Any]]:
    """The strategic tools (stateless, shared by every strategic agent)."""
    return [
        find_protagonist_tool,
        score_themes_tool,
        measure_tension_tool,
        summarize_narrative,
        select_arc_template,
        decompose_goal,
        check_arc,
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


STRATEGIC_SPEC = RoleSpec("strategic", StrategicPlan, StrategicPlanner, strategic_tools)
"""The strategic role: narrative analysis and arc decomposition (its plans have no cross-agent
steps)."""

StrategicAgent: Final = AgentRole("StrategicAgent", STRATEGIC_SPEC, role_builder(STRATEGIC_SPEC))
"""Builds the strategic agent: ``StrategicAgent(dispatcher=, engine_config=, tracer_provider=,
store=)``, optionally with another ``planner``, other ``tools`` or a ``prepare`` step."""
