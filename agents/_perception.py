"""The perception agent: reads passages into the world model and changes it by actions.

Its tools act on text and on the agent's own :class:`~agents.WorldModel`. Plans:

- ``ExtractEntities``: ``split`` (split_sentences) -> ``match`` (match_patterns, with the plan's
  extraction patterns) -> ``resolve`` (resolve_entities, with the plan's resolution strategy) ->
  ``merge`` (merge_world, a side effect).
- ``FindSpatialContext``: ``locate`` (locate_entities) and ``facts`` (world_facts: the facts
  linked to the requested entities), in parallel.
- ``UpdateWorldState``: ``check`` (check_actions, a dry run) -> ``apply`` (apply_actions, a side
  effect; skipped for a dry run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from opentelemetry.trace import TracerProvider
from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._extract import (
    DEFAULT_PATTERNS,
    ExtractionPattern,
    Mention,
    ResolutionStrategy,
    match_sentence,
    resolve_mentions,
    split_sentences,
)
from stratagem.agents._role import RoleAgent, RoleSpec
from stratagem.agents._tool import Tool, tool
from stratagem.agents._world import WorldModel, WorldStore
from stratagem.planning import (
    Dispatcher,
    EngineConfig,
    LogicError,
    Plan,
    PlanResult,
    StateStore,
    ToolStep,
    ref,
)
from stratagem.protocol import (
    Action,
    Entity,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FailedPreconditionError,
    FindSpatialContextRequest,
    FindSpatialContextResponse,
    Relation,
    SpatialContext,
    UpdateWorldStateRequest,
    UpdateWorldStateResponse,
    WireModel,
)

__all__ = [
    "PerceptionAgent",
    "PerceptionPlan",
    "PerceptionPlanner",
    "StateUpdate",
    "perception_tools",
]


class StateUpdate(BaseModel):
    """One planned change to (or read of) the world model.

    Attributes:
        step: The plan step that performs it.
        operation: ``merge`` (add extracted facts), ``check`` (dry-run actions), ``apply`` (apply
            actions) or ``read`` (read facts).
        description: What it changes, e.g. ``"move(mira, courtyard, garden)"``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str
    operation: Literal["merge", "check", "apply", "read"]
    description: str = ""


class PerceptionPlan(Plan):
    """A perception plan: how text is read and how the world model changes.

    Attributes:
        extraction_patterns: The sentence patterns the ``match_patterns`` step uses.
        entity_resolution_strategy: How noun phrases become entities.
        state_update_sequence: The world-model reads and changes, in order.
    """

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


class _Keeper:
    """Saves the world after each change, before the tool that made it returns (so before the
    engine records the step as done, and before any answer reports it)."""

    def __init__(self, world: WorldModel, store: WorldStore | None) -> None:
        self.world = world
        self._store = store
        self._lock = asyncio.Lock()
        self._saved = world.version

    async def keep(self) -> None:
        if self._store is None:
            return
        async with self._lock:  # one save at a time, each of the latest state
            if self.world.version == self._saved:
                return
            version = self.world.version
            await asyncio.to_thread(self._store.save, self.world.snapshot())
            self._saved = version


def perception_tools(world: WorldModel, store: WorldStore | None = None) -> list[Tool[Any, Any]]:
    """The perception tools, bound to ``world``.

    Args:
        world: The world model the tools read and change.
        store: Where each change is saved before the tool that made it returns (``None``: the
            world lives in memory only).

    Returns:
        ``split_sentences``, ``match_patterns``, ``resolve_entities``, ``merge_world``,
        ``locate_entities``, ``world_facts``, ``check_actions`` and ``apply_actions``.
    """

    @tool(name="split_sentences")
    async def split_text(text: str) -> Sentences:
        """Split a passage into sentences."""
        return Sentences(sentences=split_sentences(text))

    @tool
    async def match_patterns(sentences: list[str], patterns: list[ExtractionPattern]) -> Mentions:
        """Match each sentence against the extraction patterns (first match wins)."""
        found = [
            mention
            for index, sentence in enumerate(sentences)
            if (mention := match_sentence(index, sentence, patterns)) is not None
        ]
        return Mentions(mentions=found)

    @tool
    async def resolve_entities(
        mentions: list[Mention], strategy: ResolutionStrategy = "head_noun"
    ) -> Resolved:
        """Turn mentions into entities (slug ids) and facts."""
        entities, relations = resolve_mentions(mentions, strategy)
        return Resolved(entities=entities, relations=relations)

    keeper = _Keeper(world, store)

    @tool(side_effects=True, idempotent=True)
    async def merge_world(entities: list[Entity], relations: list[Relation]) -> WorldVersion:
        """Merge entities and facts into the world model (newer locations replace older)."""
        version = world.merge(entities, relations)
        await keeper.keep()
        return WorldVersion(world_version=version)

    @tool
    async def locate_entities(entity_ids: list[str]) -> Contexts:
        """Where each entity is, what it contains and where one can go from it."""
        return Contexts(
            contexts=[
                SpatialContext(
                    entity_id=entity_id,
                    location=world.locate(entity_id),
                    contains=world.contains(entity_id),
                    neighbours=world.neighbours(entity_id),
                )
                for entity_id in entity_ids
            ]
        )

    @tool
    async def world_facts(entity_ids: list[str] | None = None) -> Facts:
        """The facts that currently hold: all of them, or those connected to ``entity_ids``."""
        facts = world.facts() if entity_ids is None else world.facts_about(entity_ids)
        return Facts(facts=facts, world_version=world.version)

    @tool
    async def check_actions(actions: list[Action]) -> Changes:
        """Check actions against the world without changing it; the change they would make."""
        return _changes(world, actions, dry_run=True)

    @tool(side_effects=True, idempotent=False)
    async def apply_actions(actions: list[Action]) -> Changes:
        """Apply actions to the world, all or nothing."""
        changes = _changes(world, actions, dry_run=False)
        await keeper.keep()
        return changes

    return [
        split_text,
        match_patterns,
        resolve_entities,
        merge_world,
        locate_entities,
        world_facts,
        check_actions,
        apply_actions,
    ]


def _changes(world: WorldModel, actions: Sequence[Action], *, dry_run: bool) -> Changes:
    try:
        added, removed = world.apply(actions, dry_run=dry_run)
    except FailedPreconditionError as exc:
        raise LogicError(exc.message) from exc
    return Changes(added=added, removed=removed, world_version=world.version)


# --- the planner -------------------------------------------------------------------------------


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
        if isinstance(request, ExtractEntitiesRequest):
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
                        input={"sentences": ref("split.sentences"), "patterns": patterns},
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
                        },
                    ),
                ],
            )
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
                        input={"entity_ids": request.entity_ids},
                    ),
                    ToolStep(
                        id="facts", tool="world_facts", input={"entity_ids": request.entity_ids}
                    ),
                ],
            )
        if isinstance(request, UpdateWorldStateRequest):
            actions = [a.model_dump() for a in request.actions]
            described = [f"{a.name}({', '.join(a.args)})" for a in request.actions]
            steps = [ToolStep(id="check", tool="check_actions", input={"actions": actions})]
            updates = [
                StateUpdate(step="check", operation="check", description=d) for d in described
            ]
            if not request.dry_run:
                steps.append(
                    ToolStep(
                        id="apply",
                        tool="apply_actions",
                        depends_on=["check"],
                        input={"actions": actions},
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
        raise ValueError(f"the perception planner cannot plan {capability!r}")

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
        raise ValueError(f"the perception planner cannot answer {capability!r}")


class PerceptionAgent(RoleAgent):
    """The perception agent: a world model and the tools that read and change it.

    Args:
        world: The world model (by default the one ``world_store`` saved last, else a new one).
        dispatcher: Sends cross-agent steps (perception plans have none).
        engine_config: The engine's limits and seed.
        tracer_provider: Where spans go.
        store: Where its engine keeps plans durably.
        world_store: Where the world is saved after every change (and read back at start), so a
            restarted agent has the world its recorded steps and stored answers describe.
    """

    spec = RoleSpec("perception", PerceptionPlan, PerceptionPlanner)

    def __init__(
        self,
        world: WorldModel | None = None,
        *,
        dispatcher: Dispatcher | None = None,
        engine_config: EngineConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        store: StateStore | None = None,
        world_store: WorldStore | None = None,
    ) -> None:
        if world is None:
            saved = world_store.load() if world_store is not None else None
            world = WorldModel.restore(saved) if saved is not None else WorldModel()
        self.world = world
        super().__init__(
            dispatcher=dispatcher,
            engine_config=engine_config,
            tracer_provider=tracer_provider,
            store=store,
            tools=perception_tools(self.world, world_store),
        )
