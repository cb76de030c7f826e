"""Narrative analysis and HTN-style arc decomposition (the strategic domain).

Everything here is deterministic: the same passage, goal and facts give the same protagonist,
themes, tension and beats.

Arc templates are HTN methods. Each decomposes a goal into ordered *stages* whose goal facts only
accumulate (a later stage never undoes an earlier one), so the tactical agent can plan every beat
cumulatively from the opening state:

``locked_quest``
    The goal names (or the protagonist wants) an object kept in a locked place: *the means*
    (``has(protagonist, key)``), *the threshold* (``at(protagonist, place)``), *the prize*
    (``has(protagonist, object)``).
``quest``
    The object is somewhere one can walk into: *the journey* (``at(protagonist, place)``) and
    *the prize*.
``journey``
    The goal names a place: *the means* when the place is locked, then *the arrival*
    (``at(protagonist, place)``).

A template's stages are fitted to exactly the beats asked for: fewer beats merge neighbouring
stages (earlier groups take the extra stage); more beats first open with *the longing*
(``wants(protagonist, object)``, when that fact holds), then close with *aftermath* beats that
restate the final goals (already met, so they need no further actions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._extract import slugify
from stratagem.agents._world import WorldModel
from stratagem.protocol import Beat, Entity, Relation

__all__ = [
    "THEME_LEXICONS",
    "ArcChoice",
    "ArcError",
    "Stage",
    "decompose",
    "find_protagonist",
    "fit_stages",
    "measure_tension",
    "score_themes",
    "select_template",
    "template_stages",
]

Template = Literal["locked_quest", "quest", "journey"]

THEME_LEXICONS: Final[dict[str, tuple[str, ...]]] = {
    "loss": ("lost", "lose", "loss", "gone", "grief", "mourn", "missing", "vanished", "forgotten"),
    "trust": (
        "trust",
        "trusted",
        "friend",
        "friends",
        "promise",
        "promised",
        "loyal",
        "faith",
        "oath",
        "knows",
    ),
    "courage": ("brave", "courage", "fear", "fears", "afraid", "dare", "dares", "storm", "danger"),
    "betrayal": ("betray", "betrayed", "traitor", "lie", "lied", "deceive", "stolen", "stole"),
    "home": ("home", "return", "returns", "cottage", "hearth", "family", "kin"),
    "hope": ("hope", "light", "lantern", "dawn", "wish", "bloom", "spring"),
    "power": ("crown", "throne", "king", "queen", "kingdom", "rule", "reign"),
}
"""Keywords per theme; a theme scores one point per keyword occurrence."""

_TENSION_WORDS: Final = frozenset(
    {
        "locked",
        "lost",
        "dark",
        "darker",
        "storm",
        "fear",
        "fears",
        "danger",
        "guard",
        "guards",
        "night",
        "alone",
        "cold",
        "stolen",
        "wants",
        "seeks",
        "never",
        "must",
    }
)
_WORD = re.compile(r"[a-z]+")
_CAPITALISED = re.compile(r"\b(?!(?:The|A|An|And|But|Long|In|On|At)\b)[A-Z][a-z]+\b")
_NON_CHARACTER_WORDS: Final = frozenset({"the", "a", "an"})


class ArcError(ValueError):
    """The goal cannot be decomposed over these facts (no target, a lock without a key)."""


class ArcChoice(BaseModel):
    """The template chosen for a goal and the entities it binds.

    Attributes:
        template: The template's name.
        protagonist: Who pursues the goal.
        target: The object (``locked_quest``, ``quest``) or place (``journey``) the goal is about.
        place: Where the target is (the place itself for ``journey``).
        key: The object that opens ``place`` when it is locked, else ``""``.
        wanted: Whether ``wants(protagonist, target)`` holds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: Template
    protagonist: str
    target: str
    place: str = ""
    key: str = ""
    wanted: bool = False


class Stage(BaseModel):
    """One stage of an arc before it is numbered as a beat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    purpose: str
    goals: list[Relation] = Field(min_length=1)


def _rel(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def find_protagonist(text: str, entities: Sequence[Entity]) -> str:
    """The most-mentioned character (ties go to the first to appear), as an entity id.

    Args:
        text: The passage.
        entities: Known entities; only characters are candidates. When there are none, capitalised
            words that are not sentence openers like "The" stand in for names.

    Returns:
        The protagonist's id, or ``""`` when the passage names no one.
    """
    candidates = [(e.id, e.name) for e in entities if e.kind == "character"]
    if not candidates:
        names = dict.fromkeys(m.group(0) for m in _CAPITALISED.finditer(text))
        candidates = [(slugify(n), n) for n in names if n.lower() not in _NON_CHARACTER_WORDS]
    best: tuple[int, int, str] | None = None
    for entity_id, name in candidates:
        hits = [m.start() for m in re.finditer(rf"\b{re.escape(name)}\b", text)]
        if not hits:
            continue
        key = (-len(hits), hits[0], entity_id)
        if best is None or key < best:
            best = key
    return "" if best is None else best[2]


def score_themes(text: str, *, limit: int = 5) -> list[tuple[str, int]]:
    """Themes by keyword count, highest first (ties in lexicon order); themes scoring 0 omitted."""
    counts: dict[str, int] = {}
    words = _words(text)
    for theme, lexicon in THEME_LEXICONS.items():
        score = sum(1 for w in words if w in lexicon)
        if score:
            counts[theme] = score
    order = list(THEME_LEXICONS)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], order.index(item[0])))
    return ranked[:limit]


def measure_tension(text: str) -> float:
    """Tension in [0, 1]: tension words per sentence, saturating (three decimals)."""
    words = _words(text)
    sentences = max(1, len(re.findall(r"[.!?]", text)))
    hits = sum(1 for w in words if w in _TENSION_WORDS)
    return round(1.0 - math.exp(-2.0 * hits / sentences), 3)


def _kinds(facts: Sequence[Relation]) -> tuple[list[str], list[str], list[str]]:
    characters: dict[str, None] = {}
    places: dict[str, None] = {}
    objects: dict[str, None] = {}
    for f in facts:
        if f.predicate in {"at", "has", "wants"}:
            characters[f.subject] = None
        if f.predicate == "knows":
            characters[f.subject] = None
            characters[f.object] = None
        if f.predicate in {"at", "locked"}:
            places[f.object] = None
        if f.predicate == "connected":
            places[f.subject] = None
            places[f.object] = None
        if f.predicate in {"in", "opens"}:
            objects[f.subject] = None
        if f.predicate in {"has", "wants"}:
            objects[f.object] = None
        if f.predicate == "opens":
            places[f.object] = None
    return list(characters), list(places), [o for o in objects if o not in places]


def _mentions(goal_words: list[str], entity_id: str) -> int:
    """The position of ``entity_id``'s words in the goal, or -1."""
    words = entity_id.split("_")
    for i in range(len(goal_words) - len(words) + 1):
        if goal_words[i : i + len(words)] == words:
            return i
    return -1


def select_template(goal: str, protagonist: str, facts: Sequence[Relation]) -> ArcChoice:
    """Choose the arc template for ``goal`` and bind its entities from the facts.

    The target is the object the goal names, else the place it names, else the object the
    protagonist wants (longer names win over shorter ones they contain, then earlier ones).

    Args:
        goal: The goal as written, e.g. "Mira recovers the crown".
        protagonist: The protagonist's id.
        facts: The world facts.

    Returns:
        The template and its bindings.

    Raises:
        ArcError: No target can be found, or its place is locked and nothing opens it.
    """
    _, places, objects = _kinds(facts)
    goal_words = slugify(goal).split("_")

    def named(ids: list[str]) -> list[str]:
        found = [(i, _mentions(goal_words, i)) for i in ids]
        hits = [(pos, -len(i.split("_")), i) for i, pos in found if pos >= 0]
        return [i for _, _, i in sorted(hits)]

    wanted = [f.object for f in facts if f.predicate == "wants" and f.subject == protagonist]
    named_objects = named(objects)
    named_places = named(places)
    world = WorldModel()
    world.merge((), facts)
    lockable = {f.subject for f in facts if f.predicate == "locked" and f.subject == f.object}

    def key_for(place: str) -> str:
        if place not in lockable:
            return ""
        for f in facts:
            if f.predicate == "opens" and f.object == place:
                return f.subject
        raise ArcError(f"the {place} is locked and nothing in the world opens it")

    if named_objects or (not named_places and wanted):
        target = named_objects[0] if named_objects else wanted[0]
        place = world.locate(target)
        key = key_for(place) if place else ""
        return ArcChoice(
            template="locked_quest" if key else "quest",
            protagonist=protagonist,
            target=target,
            place=place,
            key=key,
            wanted=target in wanted,
        )
    if named_places:
        place = named_places[0]
        return ArcChoice(
            template="journey",
            protagonist=protagonist,
            target=place,
            place=place,
            key=key_for(place),
        )
    raise ArcError(f"goal {goal!r} names no known object or place, and {protagonist} wants nothing")


def template_stages(choice: ArcChoice) -> list[Stage]:
    """The template's own stages for these bindings (before fitting to a beat count)."""
    p, target, place, key = choice.protagonist, choice.target, choice.place, choice.key
    means = (
        Stage(
            title="The means",
            purpose=f"{p} obtains the {key}, which opens the {place}.",
            goals=[_rel(p, "has", key)],
        )
        if key
        else None
    )
    arrive = (
        Stage(
            title="The threshold" if choice.template != "journey" else "The arrival",
            purpose=f"{p} reaches the {place}.",
            goals=[_rel(p, "at", place)],
        )
        if place
        else None
    )
    stages: list[Stage] = []
    if choice.template == "journey":
        stages = [s for s in (means, arrive) if s is not None]
    else:
        if choice.template == "quest" and arrive is not None:
            arrive = arrive.model_copy(update={"title": "The journey"})
        stages = [s for s in (means, arrive) if s is not None]
        stages.append(
            Stage(
                title="The prize",
                purpose=f"{p} takes the {target}.",
                goals=[_rel(p, "has", target)],
            )
        )
    return stages


def fit_stages(stages: Sequence[Stage], beats: int, choice: ArcChoice) -> list[Stage]:
    """Fit a template's stages to exactly ``beats`` stages (see the module docstring)."""
    if beats < 1:
        raise ArcError("an arc needs at least one beat")
    core = list(stages)
    if beats <= len(core):
        base, extra = divmod(len(core), beats)
        fitted: list[Stage] = []
        start = 0
        for index in range(beats):
            size = base + (1 if index < extra else 0)
            group = core[start : start + size]
            start += size
            fitted.append(_merge(group))
        return fitted
    fitted = list(core)
    if choice.wanted and choice.template != "journey":
        fitted.insert(
            0,
            Stage(
                title="The longing",
                purpose=f"{choice.protagonist} wants the {choice.target}.",
                goals=[_rel(choice.protagonist, "wants", choice.target)],
            ),
        )
    final = core[-1].goals
    count = 0
    while len(fitted) < beats:
        count += 1
        fitted.append(
            Stage(
                title="The aftermath" if count == 1 else f"The aftermath, part {count}",
                purpose=f"What {choice.protagonist} won holds.",
                goals=list(final),
            )
        )
    return fitted[:beats]


def _merge(group: Sequence[Stage]) -> Stage:
    if len(group) == 1:
        return group[0]
    goals = list(dict.fromkeys(g for stage in group for g in stage.goals))
    titles = [group[0].title] + [s.title[0].lower() + s.title[1:] for s in group[1:]]
    title = ", ".join(titles[:-1]) + " and " + titles[-1]
    return Stage(title=title, purpose=" ".join(s.purpose for s in group), goals=goals)


def decompose(choice: ArcChoice, beats: int) -> list[Beat]:
    """Decompose the chosen template into exactly ``beats`` beats, ids ``beat_1``..``beat_N``."""
    fitted = fit_stages(template_stages(choice), beats, choice)
    return [
        Beat(id=f"beat_{i}", title=stage.title, purpose=stage.purpose, goals=stage.goals)
        for i, stage in enumerate(fitted, start=1)
    ]
