"""Rule-based extraction of story-world facts from simple prose (no model service).

The passages this understands are written in short declarative sentences. Characters are
capitalised names (``Mira``, ``Old Tom``); places and objects are lowercase noun phrases after
"the" (``the north tower``, ``the iron key``). Each :class:`ExtractionPattern` is one regular
expression matched against a whole sentence (without its final punctuation); sentences no pattern
matches are ignored. Entity ids are slugs of the name (``north_tower``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from stratagem.protocol import Entity, Relation

__all__ = [
    "ATTACH_A_MODEL",
    "DEFAULT_PATTERNS",
    "SENTENCE_FORMS",
    "ExtractionPattern",
    "Mention",
    "ResolutionStrategy",
    "match_sentence",
    "nothing_read",
    "resolve_mentions",
    "slugify",
    "split_sentences",
]

Kind = Literal["character", "place", "object"]
ResolutionStrategy = Literal["exact", "head_noun"]

# A name: capitalised words, never a sentence-initial article.
_NAME: Final = r"(?!(?:The|A|An)\b)[A-Z][a-z]+(?: [A-Z][a-z]+)*"
# A noun phrase after "the": one to four lowercase words.
_NP: Final = r"[a-z]+(?: [a-z]+){0,3}"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_SLUG_JUNK = re.compile(r"[^a-z0-9]+")


class ExtractionPattern(BaseModel):
    """One extraction rule: a sentence pattern and the fact it states.

    Attributes:
        name: A short identifier, e.g. ``"character_at_place"``.
        regex: A regular expression with named groups ``subject`` and ``object`` matched against a
            whole sentence. ``{NAME}`` and ``{NP}`` expand to the name and noun-phrase patterns.
        predicate: The relation's predicate.
        subject_kind: The kind of entity the ``subject`` group names.
        object_kind: The kind of entity the ``object`` group names.
        reflexive: The fact relates the subject to itself (``(p, locked, p)``); the pattern then
            has no ``object`` group.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    regex: str
    predicate: Literal["at", "in", "has", "connected", "locked", "opens", "knows", "wants"]
    subject_kind: Kind
    object_kind: Kind
    reflexive: bool = False

    def compiled(self) -> re.Pattern[str]:
        """The regular expression with its placeholders expanded."""
        return _compile(self.regex)


@functools.lru_cache(maxsize=256)
def _compile(regex: str) -> re.Pattern[str]:
    return re.compile(regex.replace("{NAME}", _NAME).replace("{NP}", _NP))


DEFAULT_PATTERNS: Final[tuple[ExtractionPattern, ...]] = (
    ExtractionPattern(
        name="character_at_place",
        regex=r"(?P<subject>{NAME}) (?:is|was|stands|stood|waits|waited|sleeps|slept|sits|sat"
        r"|lives|lived|hides|hid) (?:in|at) the (?P<object>{NP})",
        predicate="at",
        subject_kind="character",
        object_kind="place",
    ),
    ExtractionPattern(
        name="object_in_place",
        regex=r"The (?P<subject>{NP}) (?:is|was|lies|lay|rests|rested|sits|sat|hangs|hung) "
        r"(?:in|inside) the (?P<object>{NP})",
        predicate="in",
        subject_kind="object",
        object_kind="place",
    ),
    ExtractionPattern(
        name="place_connected_place",
        regex=r"The (?P<subject>{NP}) (?:leads|opens|led|opened) (?:in|on)?to the (?P<object>{NP})",
        predicate="connected",
        subject_kind="place",
        object_kind="place",
    ),
    ExtractionPattern(
        name="character_has_object",
        regex=r"(?P<subject>{NAME}) (?:has|had|carries|carried|holds|held) the (?P<object>{NP})",
        predicate="has",
        subject_kind="character",
        object_kind="object",
    ),
    ExtractionPattern(
        name="object_opens_place",
        regex=r"The (?P<subject>{NP}) (?:opens|unlocks|opened|unlocked) the (?P<object>{NP})",
        predicate="opens",
        subject_kind="object",
        object_kind="place",
    ),
    ExtractionPattern(
        name="place_locked",
        regex=r"The (?P<subject>{NP}) (?:is|was) locked",
        predicate="locked",
        subject_kind="place",
        object_kind="place",
        reflexive=True,
    ),
    ExtractionPattern(
        name="character_wants_object",
        regex=r"(?P<subject>{NAME}) (?:wants|wanted|seeks|sought|longs for|longed for) "
        r"the (?P<object>{NP})",
        predicate="wants",
        subject_kind="character",
        object_kind="object",
    ),
    ExtractionPattern(
        name="character_knows_character",
        regex=r"(?P<subject>{NAME}) (?:knows|knew) (?P<object>{NAME})",
        predicate="knows",
        subject_kind="character",
        object_kind="character",
    ),
)


SENTENCE_FORMS: Final[dict[str, str]] = {
    "character_at_place": "Mira waits in the courtyard.",
    "object_in_place": "The iron key lies in the garden.",
    "place_connected_place": "The courtyard leads to the garden.",
    "character_has_object": "Mira has the lantern.",
    "object_opens_place": "The iron key opens the vault.",
    "place_locked": "The vault is locked.",
    "character_wants_object": "Mira wants the silver crown.",
    "character_knows_character": "Mira knows Old Tom.",
}
"""One sentence each ``DEFAULT_PATTERNS`` pattern reads, by pattern name (``docs/goals.md`` lists
every verb each one takes)."""

ATTACH_A_MODEL: Final = (
    'or let a model read ordinary prose: STRATAGEM_PLANNERS=\'{"perception": "model"}\' with '
    "STRATAGEM_MODEL_URL (or 'make model-server')"
)
"""How to read prose the patterns do not: the perception agent's model planner."""


def nothing_read(patterns: Sequence[ExtractionPattern]) -> str:
    """The one line a passage gets when no sentence of it matches any of ``patterns``: the
    sentence forms they read (an example of each built-in one, else the patterns' names) and how
    to attach a model instead."""
    forms = [
        f"'{SENTENCE_FORMS[p.name]}'" if p.name in SENTENCE_FORMS else p.name for p in patterns
    ]
    return (
        "no sentence of the passage states a fact the extractor reads; write short sentences "
        f"like {', '.join(forms) or '(no patterns given)'} (capitalised names for characters, "
        f"'the ...' for places and objects; docs/goals.md), {ATTACH_A_MODEL}"
    )


class Mention(BaseModel):
    """One fact as stated in one sentence, before entity resolution.

    Attributes:
        sentence: The sentence's index in the passage.
        pattern: The name of the pattern that matched.
        subject: The subject as written.
        subject_kind: Its kind.
        predicate: The relation's predicate.
        object: The object as written.
        object_kind: Its kind.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sentence: int
    pattern: str
    subject: str
    subject_kind: Kind
    predicate: str
    object: str
    object_kind: Kind


def slugify(name: str) -> str:
    """An entity id from a name: lowercase words joined by ``_`` (``North Tower``: ``north_tower``).

    A name that starts with a digit is prefixed with ``e_`` so the id stays a valid slug.
    """
    slug = _SLUG_JUNK.sub("_", name.lower()).strip("_")[:64]
    if not slug:
        return "unnamed"
    return slug if slug[0].isalpha() else f"e_{slug}"[:64]


def split_sentences(text: str) -> list[str]:
    """Split a passage into sentences without their final punctuation, blank ones dropped."""
    sentences = []
    for chunk in _SENTENCE_END.split(text):
        sentence = " ".join(chunk.split()).rstrip(".!?").strip()
        if sentence:
            sentences.append(sentence)
    return sentences


def match_sentence(
    index: int, sentence: str, patterns: Sequence[ExtractionPattern]
) -> Mention | None:
    """The first pattern that matches the whole sentence, as a :class:`Mention`."""
    for pattern in patterns:
        found = pattern.compiled().fullmatch(sentence)
        if found is None:
            continue
        subject = found.group("subject")
        obj = subject if pattern.reflexive else found.group("object")
        return Mention(
            sentence=index,
            pattern=pattern.name,
            subject=subject,
            subject_kind=pattern.subject_kind,
            predicate=pattern.predicate,
            object=obj,
            object_kind=pattern.subject_kind if pattern.reflexive else pattern.object_kind,
        )
    return None


def resolve_mentions(
    mentions: Iterable[Mention], strategy: ResolutionStrategy = "head_noun"
) -> tuple[list[Entity], list[Relation]]:
    """Turn mentions into entities and facts.

    Entities are keyed by slug; the first mention fixes an entity's kind and display name. With
    ``head_noun`` a short noun phrase that is the tail of exactly one longer phrase of the same kind
    names that entity (``the key`` -> ``iron_key`` when ``the iron key`` is the only key); with
    ``exact`` every distinct phrase is its own entity.

    Args:
        mentions: The mentions, in passage order.
        strategy: How noun phrases are matched to entities.

    Returns:
        ``(entities, relations)``: entities in order of first mention, facts in passage order
        without duplicates.
    """
    ordered = list(mentions)
    kinds: dict[str, Kind] = {}
    names: dict[str, str] = {}
    for mention in ordered:
        for name, kind in (
            (mention.subject, mention.subject_kind),
            (mention.object, mention.object_kind),
        ):
            slug = slugify(name)
            if slug not in kinds:
                kinds[slug] = kind
                names[slug] = name
    alias: dict[str, str] = {}
    if strategy == "head_noun":
        for slug, kind in kinds.items():
            if kind == "character":
                continue
            longer = [
                other
                for other, other_kind in kinds.items()
                if other != slug and other_kind == kind and other.endswith("_" + slug)
            ]
            if len(longer) == 1:
                alias[slug] = longer[0]
    entities: dict[str, Entity] = {}
    relations: dict[Relation, None] = {}
    for mention in ordered:
        subject = alias.get(slugify(mention.subject), slugify(mention.subject))
        obj = alias.get(slugify(mention.object), slugify(mention.object))
        for slug in (subject, obj):
            if slug not in entities:
                entities[slug] = Entity(id=slug, name=names[slug], kind=kinds[slug])
        fact = Relation.model_validate(
            {"subject": subject, "predicate": mention.predicate, "object": obj}
        )
        relations[fact] = None
    return list(entities.values()), list(relations)
