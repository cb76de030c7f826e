"""STRIPS-style world actions and a goal-directed search over them (the tactical domain).

Ground actions, their preconditions and effects (``c`` a character, ``a``/``b`` places, ``o``/``k``
objects):

=========================  ===========================================  ============================
action                     preconditions                                effects
=========================  ===========================================  ============================
``move(c, a, b)``          at(c, a), connected(a, b) [#]_, b not locked  +at(c, b), -at(c, a)
``unlock(c, a, b, k)``     at(c, a), connected(a, b), has(c, k),        -locked(b, b)
                           opens(k, b), locked(b, b)
``take(c, o, p)``          at(c, p), in(o, p)                           +has(c, o), -in(o, p)
``give(d, o, c, p)``       at(d, p), at(c, p), has(d, o)                +has(c, o), -has(d, o)
=========================  ===========================================  ============================

.. [#] ``connected`` is symmetric; the precondition names the fact in the direction the world
   stores it, so that the world model can check it literally. "Not locked" cannot be written as a
   (positive) precondition; the search honours it and the world model enforces it as an invariant.

Only the *actors* (the characters the goals are about) move, unlock and take; any character may
give what it holds to an actor standing in the same place. The search is A* over world states with
the number of unmet goal facts as heuristic: every action adds at most one fact, so the heuristic is
admissible and the first sequence found is a shortest one. Successors are expanded in a fixed order,
so the same facts and goals always give the same sequence.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stratagem.agents._world import run_actions
from stratagem.protocol import Action, FailedPreconditionError, Relation

__all__ = [
    "FLUENT_PREDICATES",
    "GroundAction",
    "SearchOutcome",
    "Simulation",
    "actors_for",
    "ground_actions",
    "search",
    "simulate",
]

Triple = tuple[str, str, str]

FLUENT_PREDICATES = frozenset({"at", "in", "has", "locked"})
"""Predicates actions change; every other predicate is static."""


def _rel(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


@dataclass(frozen=True, slots=True)
class GroundAction:
    """A ground action with its effects as triples, ready for fast state checks.

    Attributes:
        action: The wire form, carrying preconditions, adds and deletes.
        pre: The fluent preconditions, checked in every state.
        static: The static preconditions, checked once against the opening facts.
        adds: Triples the action makes true.
        deletes: Triples the action makes false.
        enters: The place the action enters (must not be locked), or ``""``.
    """

    action: Action
    pre: frozenset[Triple]
    static: frozenset[Triple]
    adds: frozenset[Triple]
    deletes: frozenset[Triple]
    enters: str = ""

    @classmethod
    def from_action(cls, action: Action) -> GroundAction:
        """The ground form of an action given on the wire (it enters where it puts someone)."""
        enters = next((f.object for f in action.adds if f.predicate in {"at", "in"}), "")
        pre = [(f.subject, f.predicate, f.object) for f in action.preconditions]
        return cls(
            action=action,
            pre=frozenset(t for t in pre if t[1] in FLUENT_PREDICATES),
            static=frozenset(t for t in pre if t[1] not in FLUENT_PREDICATES),
            adds=frozenset((f.subject, f.predicate, f.object) for f in action.adds),
            deletes=frozenset((f.subject, f.predicate, f.object) for f in action.deletes),
            enters=enters,
        )

    def applicable(self, state: frozenset[Triple]) -> bool:
        """Whether the action may run in ``state``."""
        if not self.pre <= state:
            return False
        return not (self.enters and (self.enters, "locked", self.enters) in state)

    def apply(self, state: frozenset[Triple]) -> frozenset[Triple]:
        """The state after the action."""
        return (state - self.deletes) | self.adds


def _make(
    name: str,
    args: Sequence[str],
    pre: Sequence[Triple],
    adds: Sequence[Triple],
    deletes: Sequence[Triple],
    enters: str = "",
) -> GroundAction:
    action = Action(
        name=name,
        args=list(args),
        preconditions=[_rel(*t) for t in pre],
        adds=[_rel(*t) for t in adds],
        deletes=[_rel(*t) for t in deletes],
    )
    return GroundAction(
        action=action,
        pre=frozenset(t for t in pre if t[1] in FLUENT_PREDICATES),
        static=frozenset(t for t in pre if t[1] not in FLUENT_PREDICATES),
        adds=frozenset(adds),
        deletes=frozenset(deletes),
        enters=enters,
    )


def _triples(facts: Iterable[Relation]) -> list[Triple]:
    return list(dict.fromkeys((f.subject, f.predicate, f.object) for f in facts))


def _characters(facts: Sequence[Triple]) -> list[str]:
    found: dict[str, None] = {}
    for s, p, o in facts:
        if p in {"at", "has", "wants"}:
            found[s] = None
        elif p == "knows":
            found[s] = None
            found[o] = None
    return list(found)


def actors_for(facts: Iterable[Relation], goals: Iterable[Relation]) -> list[str]:
    """The characters the goals are about (all characters when the goals name none).

    Args:
        facts: The world facts.
        goals: The goal facts.

    Returns:
        Character ids, in order of first appearance in the goals (or in the facts).
    """
    characters = _characters(_triples(facts))
    named = [g.subject for g in goals if g.subject in characters]
    return list(dict.fromkeys(named)) or characters


def ground_actions(facts: Iterable[Relation], actors: Sequence[str]) -> list[GroundAction]:
    """Every ground action the actors could take in a world that starts from ``facts``.

    Args:
        facts: The opening world facts.
        actors: The characters who move, unlock and take.

    Returns:
        The ground actions in a fixed order: moves, unlocks, takes, gives.
    """
    triples = _triples(facts)
    characters = _characters(triples)
    edges: list[tuple[str, str]] = []
    for s, p, o in triples:
        if p == "connected" and s != o:
            edges.append((s, o))
    directed: dict[tuple[str, str], Triple] = {}
    for a, b in edges:
        directed.setdefault((a, b), (a, "connected", b))
        directed.setdefault((b, a), (a, "connected", b))
    opens = [(s, o) for s, p, o in triples if p == "opens"]
    lockable = {s for s, p, o in triples if p == "locked" and s == o}
    lying = [(s, o) for s, p, o in triples if p == "in"]
    objects = list(
        dict.fromkeys(
            [s for s, p, _ in triples if p in {"in", "opens"}]
            + [o for _, p, o in triples if p in {"has", "wants"}]
        )
    )
    places = list(dict.fromkeys([a for a, _ in directed] + [o for _, p, o in triples if p == "at"]))
    start = {s: o for s, p, o in triples if p == "at"}

    result: list[GroundAction] = []
    for c in actors:
        for (a, b), edge in directed.items():
            result.append(
                _make(
                    "move",
                    (c, a, b),
                    [(c, "at", a), edge],
                    [(c, "at", b)],
                    [(c, "at", a)],
                    enters=b,
                )
            )
    for c in actors:
        for (a, b), edge in directed.items():
            if b not in lockable:
                continue
            for key, door in opens:
                if door != b:
                    continue
                result.append(
                    _make(
                        "unlock",
                        (c, a, b, key),
                        [(c, "at", a), edge, (c, "has", key), (key, "opens", b), (b, "locked", b)],
                        [],
                        [(b, "locked", b)],
                    )
                )
    for c in actors:
        for o, p in lying:
            result.append(
                _make(
                    "take", (c, o, p), [(c, "at", p), (o, "in", p)], [(c, "has", o)], [(o, "in", p)]
                )
            )
    for giver in characters:
        giver_places = places if giver in actors else [start[giver]] if giver in start else []
        for c in actors:
            if c == giver:
                continue
            for o in objects:
                for p in giver_places:
                    result.append(
                        _make(
                            "give",
                            (giver, o, c, p),
                            [(giver, "at", p), (c, "at", p), (giver, "has", o)],
                            [(c, "has", o)],
                            [(giver, "has", o)],
                        )
                    )
    return result


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """What a search found.

    Attributes:
        actions: The action sequence, or ``None`` when none was found within the bounds.
        explored: The number of states expanded.
        exhausted: Whether the node cap (rather than the depth bound) ended the search.
        stopped: Whether ``should_stop`` ended it (its caller gave up: a deadline, a cancel).
    """

    actions: list[Action] | None
    explored: int
    exhausted: bool = False
    stopped: bool = False


STOP_CHECK_EVERY = 256
"""How many states a search expands between two looks at ``should_stop`` (a few ms of work)."""


def search(
    facts: Iterable[Relation],
    goals: Sequence[Relation],
    *,
    max_depth: int,
    node_cap: int = 20_000,
    actions: Sequence[GroundAction] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SearchOutcome:
    """A* search for a shortest action sequence from ``facts`` to a state where all goals hold.

    Args:
        facts: The opening world facts.
        goals: Facts that must all hold at the end.
        max_depth: The longest sequence considered.
        node_cap: The most states expanded before giving up.
        actions: The ground actions to use (grounded from ``facts`` for the goals' actors when
            omitted).
        should_stop: Asked every ``STOP_CHECK_EVERY`` expansions; ``True`` ends the search
            (``stopped``): how a search on a worker thread hears that its caller gave up.

    Returns:
        The outcome; ``actions`` is ``None`` when no sequence was found.
    """
    fact_list = list(facts)
    if actions is None:
        actions = ground_actions(fact_list, actors_for(fact_list, goals))
    all_triples = _triples(fact_list)
    static = frozenset(t for t in all_triples if t[1] not in FLUENT_PREDICATES)
    start = frozenset(t for t in all_triples if t[1] in FLUENT_PREDICATES)
    goal_set = frozenset((g.subject, g.predicate, g.object) for g in goals)
    fluent_goals = frozenset(g for g in goal_set if g[1] in FLUENT_PREDICATES)
    if not (goal_set - fluent_goals) <= static:
        return SearchOutcome(None, 0)
    usable = [a for a in actions if a.static <= static]

    def unmet(state: frozenset[Triple]) -> int:
        return len(fluent_goals - state)

    counter = itertools.count()
    frontier: list[tuple[int, int, int, frozenset[Triple]]] = [
        (unmet(start), 0, next(counter), start)
    ]
    parents: dict[frozenset[Triple], tuple[frozenset[Triple], int] | None] = {start: None}
    depth: dict[frozenset[Triple], int] = {start: 0}
    explored = 0
    while frontier:
        _, g, _, state = heapq.heappop(frontier)
        if g > depth[state]:
            continue
        if fluent_goals <= state:
            return SearchOutcome(_path(parents, usable, state), explored)
        explored += 1
        if explored > node_cap:
            return SearchOutcome(None, explored - 1, exhausted=True)
        if should_stop is not None and explored % STOP_CHECK_EVERY == 0 and should_stop():
            return SearchOutcome(None, explored, stopped=True)
        if g >= max_depth:
            continue
        for index, ground in enumerate(usable):
            if not ground.applicable(state):
                continue
            successor = ground.apply(state)
            if successor in depth and depth[successor] <= g + 1:
                continue
            depth[successor] = g + 1
            parents[successor] = (state, index)
            heapq.heappush(frontier, (g + 1 + unmet(successor), g + 1, next(counter), successor))
    return SearchOutcome(None, explored)


def _path(
    parents: dict[frozenset[Triple], tuple[frozenset[Triple], int] | None],
    actions: Sequence[GroundAction],
    state: frozenset[Triple],
) -> list[Action]:
    steps: list[Action] = []
    link = parents[state]
    while link is not None:
        previous, index = link
        steps.append(actions[index].action)
        link = parents[previous]
    steps.reverse()
    return steps


@dataclass(slots=True)
class Simulation:
    """The result of re-running an action sequence.

    Attributes:
        facts: The facts at the end (the opening facts when an action failed).
        error: Why the sequence stopped, or ``""`` when every action ran.
        unmet: Goal facts that do not hold at the end.
    """

    facts: list[Relation]
    error: str = ""
    unmet: list[Relation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every action ran and every goal holds."""
        return not self.error and not self.unmet


def simulate(
    facts: Iterable[Relation], actions: Sequence[Action], goals: Sequence[Relation] = ()
) -> Simulation:
    """Re-run ``actions`` from ``facts`` checking each precondition and the locked-place rule.

    Args:
        facts: The opening facts.
        actions: The sequence to check.
        goals: Facts that must hold at the end.

    Returns:
        The simulation; ``ok`` is true when the sequence is valid and reaches the goals.
    """
    fact_list = list(facts)
    try:
        state, _, _ = run_actions(fact_list, actions)
    except FailedPreconditionError as exc:
        return Simulation(fact_list, error=exc.message)
    return Simulation(list(state), unmet=[g for g in goals if g not in state])
