"""The perception agent's world model: entities and the facts that hold between them.

Facts are :class:`protocol.Relation` triples over a closed set of predicates. The encoding used by
every agent (documented once here):

==================  ========================================================================
fact                meaning
==================  ========================================================================
``(c, at, p)``      character ``c`` is in place ``p``
``(o, in, p)``      object ``o`` lies in place (or container) ``p``
``(c, has, o)``     character ``c`` holds object ``o``
``(a, connected, b)`` one can move between places ``a`` and ``b``; symmetric, stored as written
``(p, locked, p)``  place ``p`` is locked: nobody may enter it until it is unlocked
``(k, opens, p)``   object ``k`` (a key) unlocks place ``p``
``(c, wants, o)``   character ``c`` wants object ``o``
``(c, knows, d)``   character ``c`` knows character ``d``
==================  ========================================================================

Location facts are functional: an entity is in one place or held by one character at a time, so
merging a newer location fact (``at``/``in``/``has``) replaces the older one about the same entity.

Applying actions is all-or-nothing: every action's preconditions are checked against the facts as
the earlier actions of the same batch left them, and a single failure leaves the model untouched.
Besides the positive preconditions an action lists, one invariant holds for every action: nothing
enters a locked place (an action that adds ``(x, at, p)`` or ``(x, in, p)`` while ``(p, locked, p)``
holds is refused). It stands in for the negative precondition "not locked" that actions cannot
express.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from stratagem.protocol import Action, Entity, FailedPreconditionError, Relation

__all__ = ["WorldModel", "format_fact", "run_actions"]

_LOCATION_PREDICATES = frozenset({"at", "in"})


def format_fact(fact: Relation) -> str:
    """A fact as ``predicate(subject, object)``, the form used in messages."""
    return f"{fact.predicate}({fact.subject}, {fact.object})"


def _format_action(action: Action) -> str:
    return f"{action.name}({', '.join(action.args)})"


def run_actions(
    facts: Iterable[Relation], actions: Sequence[Action]
) -> tuple[dict[Relation, None], dict[Relation, None], dict[Relation, None]]:
    """Run actions over a copy of ``facts``: the one definition of what applying an action means.

    Args:
        facts: The facts before the first action.
        actions: The actions, in order.

    Returns:
        ``(state, adds, deletes)``: the facts after the last action (an ordered set) and every fact
        the actions added or deleted, in the order they did so.

    Raises:
        FailedPreconditionError: An action's precondition does not hold, or it would enter a
            locked place; the message names the action (and its position) and the fact.
    """
    state: dict[Relation, None] = dict.fromkeys(facts)
    touched_add: dict[Relation, None] = {}
    touched_del: dict[Relation, None] = {}
    for index, action in enumerate(actions, start=1):
        for pre in action.preconditions:
            if pre not in state:
                raise FailedPreconditionError(
                    f"action {index} {_format_action(action)}: precondition "
                    f"{format_fact(pre)} does not hold"
                )
        for fact in action.deletes:
            state.pop(fact, None)
            touched_del[fact] = None
        for fact in action.adds:
            if fact.predicate in _LOCATION_PREDICATES:
                lock = Relation(subject=fact.object, predicate="locked", object=fact.object)
                if lock in state:
                    raise FailedPreconditionError(
                        f"action {index} {_format_action(action)}: {fact.object} is locked "
                        f"({format_fact(lock)} holds)"
                    )
            state[fact] = None
            touched_add[fact] = None
    return state, touched_add, touched_del


class WorldModel:
    """Entities and facts, with a version bumped on every change.

    Not thread-safe; an agent uses it from one event loop, where each method runs to completion
    without yielding.
    """

    def __init__(self) -> None:
        """Create an empty world at version 0."""
        self._entities: dict[str, Entity] = {}
        # A dict used as an insertion-ordered set keeps fact listings deterministic.
        self._facts: dict[Relation, None] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """The number of changes made to the model so far."""
        return self._version

    def snapshot(self) -> dict[str, Any]:
        """The whole model as JSON-ready data (``restore`` reads it back)."""
        return {
            "version": self._version,
            "entities": [e.model_dump(mode="json") for e in self._entities.values()],
            "facts": [f.model_dump(mode="json") for f in self._facts],
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> WorldModel:
        """A model holding what ``snapshot`` saved (validated like any wire data)."""
        world = cls()
        for raw in data.get("entities", []):
            entity = Entity.model_validate(raw)
            world._entities[entity.id] = entity
        for raw in data.get("facts", []):
            world._facts[Relation.model_validate(raw)] = None
        world._version = int(data.get("version", 0))
        return world

    @property
    def entities(self) -> Mapping[str, Entity]:
        """The known entities by id (a read-only view)."""
        return MappingProxyType(self._entities)

    def facts(self) -> list[Relation]:
        """Every fact that currently holds, in the order it was first stated."""
        return list(self._facts)

    def facts_about(self, entity_ids: Iterable[str]) -> list[Relation]:
        """The facts connected to ``entity_ids``: those of every entity reachable from them
        through facts (in the order first stated).

        A goal's spatial context is its own part of the world: facts about entities no chain of
        facts links to it (other stories told to the same agent) are left out, so the cost of
        planning a goal does not grow with everything the world has learned.
        """
        linked: dict[str, list[Relation]] = {}
        for fact in self._facts:
            linked.setdefault(fact.subject, []).append(fact)
            linked.setdefault(fact.object, []).append(fact)
        seen = set(entity_ids)
        pending = list(seen)
        found: set[Relation] = set()
        while pending:
            for fact in linked.get(pending.pop(), ()):
                if fact in found:
                    continue
                found.add(fact)
                for other in (fact.subject, fact.object):
                    if other not in seen:
                        seen.add(other)
                        pending.append(other)
        return [fact for fact in self._facts if fact in found]

    def holds(self, fact: Relation) -> bool:
        """Whether ``fact`` currently holds."""
        return fact in self._facts

    def merge(self, entities: Iterable[Entity], relations: Iterable[Relation]) -> int:
        """Add entities and facts; a newer location fact replaces the older one.

        An entity already known keeps its first kind and name (the first mention wins).

        Args:
            entities: Entities to add.
            relations: Facts to add, in the order they were stated.

        Returns:
            The model's version after the merge (bumped once when anything changed).
        """
        changed = False
        for entity in entities:
            if entity.id not in self._entities:
                self._entities[entity.id] = entity
                changed = True
        for fact in relations:
            if fact in self._facts:
                continue
            for stale in _superseded(self._facts, fact):
                del self._facts[stale]
            self._facts[fact] = None
            changed = True
        if changed:
            self._version += 1
        return self._version

    def apply(
        self, actions: Sequence[Action], *, dry_run: bool = False
    ) -> tuple[list[Relation], list[Relation]]:
        """Apply actions in order, all or nothing.

        Args:
            actions: The actions; each one's preconditions must hold after the ones before it.
            dry_run: Check and compute the effects without changing the model.

        Returns:
            ``(added, removed)``: the net change, facts in the order the actions touched them.

        Raises:
            FailedPreconditionError: An action's precondition does not hold, or it would enter a
                locked place; the message names the action (and its position) and the fact. The
                model is unchanged.
        """
        state, touched_add, touched_del = run_actions(self._facts, actions)
        added = [f for f in touched_add if f in state and f not in self._facts]
        removed = [f for f in touched_del if f in self._facts and f not in state]
        if not dry_run and (added or removed):
            self._facts = state
            self._version += 1
        return added, removed

    def locate(self, entity_id: str) -> str:
        """The outermost place that (transitively) contains ``entity_id``, or ``""``.

        Containment follows ``at``, ``in`` and ``has`` upwards: a key in a chest in the hall is
        located in the hall; a key held by Mira is where Mira is.
        """
        seen = {entity_id}
        current = entity_id
        location = ""
        while True:
            parent = self._parent(current)
            if parent is None or parent in seen:
                return location
            seen.add(parent)
            current = parent
            if self._kind(parent) != "character":
                location = parent

    def contains(self, entity_id: str) -> list[str]:
        """What ``entity_id`` directly contains: who is at it, what lies in it, what it holds."""
        found: dict[str, None] = {}
        for fact in self._facts:
            if fact.predicate in _LOCATION_PREDICATES and fact.object == entity_id:
                found[fact.subject] = None
            elif fact.predicate == "has" and fact.subject == entity_id:
                found[fact.object] = None
        return list(found)

    def neighbours(self, place: str) -> list[str]:
        """The places connected to ``place``, in either direction."""
        found: dict[str, None] = {}
        for fact in self._facts:
            if fact.predicate != "connected":
                continue
            if fact.subject == place:
                found[fact.object] = None
            elif fact.object == place:
                found[fact.subject] = None
        return list(found)

    def _parent(self, entity_id: str) -> str | None:
        for fact in self._facts:
            if fact.predicate in _LOCATION_PREDICATES and fact.subject == entity_id:
                return fact.object
            if fact.predicate == "has" and fact.object == entity_id:
                return fact.subject
        return None

    def _kind(self, entity_id: str) -> str:
        entity = self._entities.get(entity_id)
        if entity is not None:
            return entity.kind
        # An entity known only from facts: a subject of "at" is a character.
        for fact in self._facts:
            if fact.subject == entity_id and fact.predicate in {"at", "has", "wants", "knows"}:
                return "character"
        return "place"


def _superseded(facts: Mapping[Relation, None], new: Relation) -> list[Relation]:
    """The location facts that ``new`` replaces (an entity is in one place at a time)."""
    if new.predicate in _LOCATION_PREDICATES:
        moved = new.subject
    elif new.predicate == "has":
        moved = new.object
    else:
        return []
    return [
        fact
        for fact in facts
        if (fact.predicate in _LOCATION_PREDICATES and fact.subject == moved)
        or (fact.predicate == "has" and fact.object == moved)
    ]
