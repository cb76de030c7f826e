"""The perception agent: reads passages into world models and changes them by actions.

Its tools act on text and on the agent's own :class:`~agents.WorldModel` s, one per named world
(:class:`Worlds`): every request names the world it acts on (``world``; ``""`` is the world named
``default``), so what one story taught the agent does not decide another's outcome. Plans:

- ``ExtractEntities``: ``split`` (split_sentences) -> ``match`` (match_patterns, with the plan's
  extraction patterns) -> ``resolve`` (resolve_entities, with the plan's resolution strategy) ->
  ``merge`` (merge_world, a side effect). With ``require_facts`` (a goal's extraction), a passage
  in which no sentence reads as a fact fails at ``match``, naming the sentence forms the patterns
  read and how to attach a model instead; without it, the answer holds nothing.
- ``FindSpatialContext``: ``locate`` (locate_entities) and ``facts`` (world_facts: the facts
  linked to the requested entities), in parallel.
- ``UpdateWorldState``: ``check`` (check_actions, a dry run) -> ``apply`` (apply_actions, a side
  effect; skipped for a dry run).
- ``ListWorlds``, ``ShowWorld``, ``ResetWorld``: one step each (list_worlds, show_world,
  reset_world; the last a side effect: the world is emptied and saved).

A tool step's ``world`` input is left out for the default world, so plans of the default world are
the plans they were before worlds had names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._agent import Agent
from stratagem.agents._extract import (
    DEFAULT_PATTERNS,
    ExtractionPattern,
    Mention,
    ResolutionStrategy,
    match_sentence,
    nothing_read,
    resolve_mentions,
    split_sentences,
)
from stratagem.agents._role import AgentOptions, AgentRole, RoleSpec, compose_agent
from stratagem.agents._tool import Tool, tool
from stratagem.agents._world import WorldModel, Worlds, WorldStore
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    research_tools,
)
from stratagem.planning import (
    LogicError,
    Plan,
    PlanResult,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    DEFAULT_WORLD,
    Action,
    Entity,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FailedPreconditionError,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
    ListWorldsRequest,
    ListWorldsResponse,
    Relation,
    ResetWorldRequest,
    ResetWorldResponse,
    ShowWorldRequest,
    ShowWorldResponse,
    SpatialContext,
    UpdateWorldStateRequest,
    UpdateWorldStateResponse,
    WireModel,
    WorldSummary,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "PERCEPTION_SPEC",
    "PerceptionAgent",
    "PerceptionPlan",
    "PerceptionPlanner",
    "StateUpdate",
    "Worlds",
    "perception_tools",
    "world_input",
]


class StateUpdate(BaseModel):
    """One planned change to (or read of) the world model.

    Attributes:
        step: The plan step that performs it.
        operation: ``merge`` (add extracted facts), ``check`` (dry-run actions), ``apply`` (apply
            actions), ``read`` (read facts) or ``reset`` (empty a world).
        description: What it changes, e.g. ``"move(mira, courtyard, garden)"``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    operation: Literal["merge", "check", "apply", "read", "reset"]
    description: str = ""


class PerceptionPlan(Plan):
    """A perception plan: how text is read and how the world model changes.

    Attributes:
        extraction_patterns: The sentence patterns the ``match_patterns`` step uses.
        entity_resolution_strategy: How noun phrases become entities.
        state_update_sequence: The world-model reads and changes, in order.
    """

    # What the planner decided, for the record: nothing runs these in a user's plan.
    planner_fields: ClassVar[frozenset[str]] = frozenset(
        {"extraction_patterns", "entity_resolution_strategy", "state_update_sequence"}
    )

    extraction_patterns: list[ExtractionPattern] = Field(default_factory=list)
    entity_resolution_strategy: ResolutionStrategy = "head_noun"
    state_update_sequence: list[StateUpdate] = Field(default_factory=list)


# --- tool inputs and outputs -------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sentences(_Out):
    """The sentences of a passage."""

    sentences: list[str]


class Mentions(_Out):
    """Facts as stated, before entity resolution."""

    mentions: list[Mention]


class Resolved(_Out):
    """Entities and facts after resolution."""

    entities: list[Entity]
    relations: list[Relation]


class WorldVersion(_Out):
    """The world model's version after a change."""

    world_version: int


class Contexts(_Out):
    """Spatial contexts of entities."""

    contexts: list[SpatialContext]


class Facts(_Out):
    """The world's current facts."""

    facts: list[Relation]
    world_version: int


class Changes(_Out):
    """The net change actions make (or would make)."""

    added: list[Relation]
    removed: list[Relation]
    world_version: int


class WorldList(_Out):
    """The worlds, by name."""

    worlds: list[WorldSummary]
    total: int


class WorldContents(_Out):
    """Everything one world holds."""

    world: str
    version: int
    entities: list[Entity]
    facts: list[Relation]


class WorldReset(_Out):
    """What emptying a world removed."""

    world: str
    version: int
    entities_removed: int
    facts_removed: int


_MAX_LISTED = 1000


def perception_tools(worlds: Worlds | WorldModel) -> list[Tool[Any, Any]]:
    """The perception tools, bound to ``worlds``.

    Args:
        worlds: The worlds the tools read and change (a lone ``WorldModel`` is the default world
            of worlds kept in memory only).

    Returns:
        ``split_sentences``, ``match_patterns``, ``resolve_entities``, ``merge_world``,
        ``locate_entities``, ``world_facts``, ``check_actions``, ``apply_actions``,
        ``list_worlds``, ``show_world`` and ``reset_world``.
    """
    if isinstance(worlds, WorldModel):
        worlds = Worlds(None, worlds)
    return [*_reading_tools(), *_world_tools(worlds), *_admin_tools(worlds)]


def _reading_tools() -> list[Tool[Any, Any]]:
    """The tools that read a passage: sentences, the patterns' mentions, entities and facts."""

    @tool(name="split_sentences")
    async def split_text(text: str) -> Sentences:
        """Split a passage into sentences."""
        return Sentences(sentences=split_sentences(text))

    @tool
    async def match_patterns(
        sentences: list[str], patterns: list[ExtractionPattern], required: bool = False
    ) -> Mentions:
        """Match each sentence against the extraction patterns (first match wins); with
        ``required``, a passage in which no sentence matches fails, naming the forms the patterns
        read."""
        found = [
            mention
            for index, sentence in enumerate(sentences)
            if (mention := match_sentence(index, sentence, patterns)) is not None
        ]
        if required and not found:
            raise LogicError(nothing_read(patterns))
        return Mentions(mentions=found)

    @tool
    async def resolve_entities(
        mentions: list[Mention], strategy: ResolutionStrategy = "head_noun"
    ) -> Resolved:
        """Turn mentions into entities (slug ids) and facts."""
        entities, relations = resolve_mentions(mentions, strategy)
        return Resolved(entities=entities, relations=relations)

    return [split_text, match_patterns, resolve_entities]


def _world_tools(kept: Worlds) -> list[Tool[Any, Any]]:
    """The tools that read and change one world of ``kept``."""

    @tool(side_effects=True, idempotent=True)
    async def merge_world(
        entities: list[Entity], relations: list[Relation], world: str = ""
    ) -> WorldVersion:
        """Merge entities and facts into the world model (newer locations replace older)."""
        version = kept.get(world).merge(entities, relations)
        await kept.keep(world)
        return WorldVersion(world_version=version)

    @tool
    async def locate_entities(entity_ids: list[str], world: str = "") -> Contexts:
        """Where each entity is, what it contains and where one can go from it."""
        model = kept.get(world)
        return Contexts(
            contexts=[
                SpatialContext(
                    entity_id=entity_id,
                    location=model.locate(entity_id),
                    contains=model.contains(entity_id),
                    neighbours=model.neighbours(entity_id),
                )
                for entity_id in entity_ids
            ]
        )

    @tool
    async def world_facts(entity_ids: list[str] | None = None, world: str = "") -> Facts:
        """The facts that currently hold: all of them, or those connected to ``entity_ids``."""
        model = kept.get(world)
        facts = model.facts() if entity_ids is None else model.facts_about(entity_ids)
        return Facts(facts=facts, world_version=model.version)

    @tool
    async def check_actions(actions: list[Action], world: str = "") -> Changes:
        """Check actions against the world without changing it; the change they would make."""
        return _changes(kept.get(world), actions, dry_run=True)

    @tool(side_effects=True, idempotent=False)
    async def apply_actions(actions: list[Action], world: str = "") -> Changes:
        """Apply actions to the world, all or nothing."""
        changes = _changes(kept.get(world), actions, dry_run=False)
        await kept.keep(world)
        return changes

    return [merge_world, locate_entities, world_facts, check_actions, apply_actions]


def _admin_tools(kept: Worlds) -> list[Tool[Any, Any]]:
    """The tools over the worlds themselves: list, show and reset them."""

    @tool
    async def list_worlds(prefix: str = "") -> WorldList:
        """The worlds whose name starts with ``prefix``, with their sizes (at most 1000)."""
        names = [name for name in kept.names() if name.startswith(prefix)]
        summaries = []
        for name in names[:_MAX_LISTED]:
            model = kept.get(name)
            summaries.append(
                WorldSummary(
                    name=name,
                    version=model.version,
                    entities=len(model.entities),
                    facts=len(model.facts()),
                )
            )
        return WorldList(worlds=summaries, total=len(names))

    @tool
    async def show_world(world: str) -> WorldContents:
        """Every entity and fact of a world that exists."""
        if world not in kept.names():
            raise LogicError(_unknown_world(world, kept.names()))
        model = kept.get(world)
        return WorldContents(
            world=world,
            version=model.version,
            entities=list(model.entities.values()),
            facts=model.facts(),
        )

    @tool(side_effects=True, idempotent=True)
    async def reset_world(world: str) -> WorldReset:
        """Empty a world that exists: no entity, no fact; saved before this returns."""
        if world not in kept.names():
            raise LogicError(_unknown_world(world, kept.names()))
        fresh, entities, facts = await kept.reset(world)
        return WorldReset(
            world=world, version=fresh.version, entities_removed=entities, facts_removed=facts
        )

    return [list_worlds, show_world, reset_world]


def _unknown_world(world: str, names: Sequence[str]) -> str:
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return f"no world {world!r}; worlds: {shown or 'none yet'} ('stratagem world list')"


def _changes(world: WorldModel, actions: Sequence[Action], *, dry_run: bool) -> Changes:
    try:
        added, removed = world.apply(actions, dry_run=dry_run)
    except FailedPreconditionError as exc:
        raise LogicError(exc.message) from exc
    return Changes(added=added, removed=removed, world_version=world.version)


# --- the planner -------------------------------------------------------------------------------


def world_input(world: str) -> dict[str, str]:
    """A step's ``world`` input: none for the default world (its plans stay as they were)."""
    return {} if world in ("", DEFAULT_WORLD) else {"world": world}


class PerceptionPlanner:
    """Plans the perception capabilities with the agent's tools.

    Args:
        patterns: The extraction patterns ExtractEntities plans use.
        strategy: The entity resolution strategy they use.
    """

    def __init__(
        self,
        patterns: Sequence[ExtractionPattern] = DEFAULT_PATTERNS,
        strategy: ResolutionStrategy = "head_noun",
    ) -> None:
        self.patterns = list(patterns)
        self.strategy: ResolutionStrategy = strategy

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> PerceptionPlan:
        """The plan for one perception request (see the module docstring).

        Raises:
            ValueError: For a capability this planner does not know.
        """
        world = world_input(getattr(request, "world", ""))
        if isinstance(request, ExtractEntitiesRequest):
            return self._extract_plan(request, plan_id, world)
        if isinstance(request, FindSpatialContextRequest):
            return PerceptionPlan(
                id=plan_id,
                owner="perception",
                goal=f"spatial context of {', '.join(request.entity_ids)}"[:2000],
                state_update_sequence=[
                    StateUpdate(step="locate", operation="read", description="spatial contexts"),
                    StateUpdate(step="facts", operation="read", description="facts linked to them"),
                ],
                steps=[
                    ToolStep(
                        id="locate",
                        tool="locate_entities",
                        input={"entity_ids": request.entity_ids, **world},
                    ),
                    ToolStep(
                        id="facts",
                        tool="world_facts",
                        input={"entity_ids": request.entity_ids, **world},
                    ),
                ],
            )
        if isinstance(request, UpdateWorldStateRequest):
            actions = [a.model_dump() for a in request.actions]
            described = [f"{a.name}({', '.join(a.args)})" for a in request.actions]
            steps = [
                ToolStep(id="check", tool="check_actions", input={"actions": actions, **world})
            ]
            updates = [
                StateUpdate(step="check", operation="check", description=d) for d in described
            ]
            if not request.dry_run:
                steps.append(
                    ToolStep(
                        id="apply",
                        tool="apply_actions",
                        depends_on=["check"],
                        input={"actions": actions, **world},
                    )
                )
                updates += [
                    StateUpdate(step="apply", operation="apply", description=d) for d in described
                ]
            return PerceptionPlan(
                id=plan_id,
                owner="perception",
                goal=("check " if request.dry_run else "apply ")
                + f"{len(request.actions)} action(s)",
                state_update_sequence=updates,
                steps=steps,
            )
        if isinstance(request, ListWorldsRequest | ShowWorldRequest | ResetWorldRequest):
            return self._world_plan(request, plan_id)
        raise ValueError(f"the perception planner cannot plan {capability!r}")

    def _extract_plan(
        self, request: ExtractEntitiesRequest, plan_id: str, world: dict[str, str]
    ) -> PerceptionPlan:
        """Read a passage with the patterns and merge what they find into the world."""
        patterns = [p.model_dump() for p in self.patterns]
        return PerceptionPlan(
            id=plan_id,
            owner="perception",
            goal=f"extract entities and relations from a passage of {len(request.text)} chars",
            extraction_patterns=self.patterns,
            entity_resolution_strategy=self.strategy,
            state_update_sequence=[
                StateUpdate(step="merge", operation="merge", description="extracted facts")
            ],
            steps=[
                ToolStep(id="split", tool="split_sentences", input={"text": request.text}),
                ToolStep(
                    id="match",
                    tool="match_patterns",
                    depends_on=["split"],
                    input={
                        "sentences": ref("split.sentences"),
                        "patterns": patterns,
                        **({"required": True} if request.require_facts else {}),
                    },
                ),
                ToolStep(
                    id="resolve",
                    tool="resolve_entities",
                    depends_on=["match"],
                    input={"mentions": ref("match.mentions"), "strategy": self.strategy},
                ),
                ToolStep(
                    id="merge",
                    tool="merge_world",
                    depends_on=["resolve"],
                    input={
                        "entities": ref("resolve.entities"),
                        "relations": ref("resolve.relations"),
                        **world,
                    },
                ),
            ],
        )

    def _world_plan(
        self, request: ListWorldsRequest | ShowWorldRequest | ResetWorldRequest, plan_id: str
    ) -> PerceptionPlan:
        """One step on the worlds themselves: list them, show one, empty one."""
        if isinstance(request, ListWorldsRequest):
            step = ToolStep(id="list", tool="list_worlds", input={"prefix": request.prefix})
            update = StateUpdate(step="list", operation="read", description="the worlds")
            goal = "list the worlds"
        elif isinstance(request, ShowWorldRequest):
            step = ToolStep(id="show", tool="show_world", input={"world": request.world})
            update = StateUpdate(step="show", operation="read", description=request.world)
            goal = f"show world {request.world}"
        else:
            step = ToolStep(id="reset", tool="reset_world", input={"world": request.world})
            update = StateUpdate(step="reset", operation="reset", description=request.world)
            goal = f"reset world {request.world}"
        return PerceptionPlan(
            id=plan_id,
            owner="perception",
            goal=goal,
            state_update_sequence=[update],
            steps=[step],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The response, from the plan's outputs."""
        out = result.outputs
        if isinstance(request, ExtractEntitiesRequest):
            # A model's extraction merges what it read directly: no resolve step ran.
            found = out["resolve"] if "resolve" in out else result.plan.step("merge").input
            return ExtractEntitiesResponse(
                entities=found["entities"],
                relations=found["relations"],
                world_version=out["merge"]["world_version"],
            )
        if isinstance(request, FindSpatialContextRequest):
            return FindSpatialContextResponse(
                contexts=out["locate"]["contexts"], facts=out["facts"]["facts"]
            )
        if isinstance(request, UpdateWorldStateRequest):
            changes = out["check"] if request.dry_run else out["apply"]
            return UpdateWorldStateResponse(
                added=changes["added"],
                removed=changes["removed"],
                world_version=changes["world_version"],
            )
        if isinstance(request, ListWorldsRequest):
            return ListWorldsResponse.model_validate(out["list"])
        if isinstance(request, ShowWorldRequest):
            return ShowWorldResponse.model_validate(out["show"])
        if isinstance(request, ResetWorldRequest):
            return ResetWorldResponse.model_validate(out["reset"])
        raise ValueError(f"the perception planner cannot answer {capability!r}")


PERCEPTION_SPEC = RoleSpec("perception", PerceptionPlan, PerceptionPlanner)
"""The perception role: named world models and the tools that read and change them (one agent's
tools share its worlds, so its build function makes them)."""


def _perception_agent(
    world: WorldModel | None = None,
    *,
    world_store: WorldStore | None = None,
    **options: Unpack[AgentOptions],
) -> Agent:
    """The perception agent.

    Args:
        world: The default world (by default the one ``world_store`` saved last, else a new one).
        world_store: Where each world is saved after every change (and read back when first
            used), so a restarted agent has the worlds its recorded steps and stored answers
            describe.
        **options: What every role's agent takes (``AgentOptions``).
    """
    worlds = Worlds(world_store, world)
    # The research tools read nothing here (no file scope): a deployment's agent replaces them
    # with tools bound to its cache and scopes (runtime/host/_research.py).
    tools = [
        *perception_tools(worlds),
        *research_tools(InMemorySourceCache(), FetchLedger(None), FileScopes(())),
    ]
    return compose_agent(PERCEPTION_SPEC, tools=tools, worlds=worlds, **options)


PerceptionAgent: Final = AgentRole("PerceptionAgent", PERCEPTION_SPEC, _perception_agent)
"""Builds the perception agent: ``PerceptionAgent(world, world_store=, dispatcher=,
engine_config=, tracer_provider=, store=)``; its ``worlds`` and ``world`` read what it keeps."""
