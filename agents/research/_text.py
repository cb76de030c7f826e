"""Text for extractive research: passages with their lines, sentences, terms and a BM25 index.

Everything here is deterministic and needs no model: the same bytes give the same passages, the
same question the same ranking.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Chunk",
    "Index",
    "chunks",
    "contains",
    "negated",
    "normalize",
    "overlap",
    "sentences",
    "terms",
]

_STOP = frozenset(
    """a about above after again all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each either else etc every
    few for from further had has have having he her here hers him his how i if in into is it its
    itself just may me might more most must my no nor not of off on once one only or other our out
    over own same shall she should so some such than that the their them then there these they
    this those through to too under until up upon very was we were what when where which while who
    whom why will with would you your yes""".split()  # noqa: SIM905 (a word list reads better)
)
_NEGATIONS = frozenset({"not", "no", "never", "none", "cannot", "nothing", "neither", "nor"})
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*|[0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*\[(\"'])")
_FENCE = re.compile(r"^\s*(```|~~~)")
_MARKUP = re.compile(r"[`*_]+|\[([^\]]*)\]\([^)]*\)")

MAX_PASSAGE_LINES = 12
"""A paragraph longer than this is cut into passages of at most this many lines."""


def _stem(word: str) -> str:
    for suffix in ("ies", "ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "ies":
                return word[: -len(suffix)] + "y"
            if suffix == "s" and word.endswith("ss"):
                return word
            return word[: -len(suffix)]
    return word


def terms(text: str) -> list[str]:
    """The content words of ``text``: lowercase, stemmed, without stop words."""
    words = (match.lower() for match in _WORD.findall(text.replace("'s", "")))
    return [_stem(word) for word in words if word not in _STOP and len(word) > 1]


def negated(text: str) -> bool:
    """Whether ``text`` says something with an odd number of negations ("not", "never", ...)."""
    words = [w.lower() for w in _WORD.findall(text.replace("n't", " not"))]
    return sum(word in _NEGATIONS for word in words) % 2 == 1


def normalize(text: str) -> str:
    """``text`` as compared: links as their text, no emphasis or code marks, spaces, lowercase."""
    plain = _MARKUP.sub(lambda m: m.group(1) or "", text)
    return " ".join(plain.split()).lower()


def contains(passage: str, claim: str) -> bool:
    """Whether the passage says the claim word for word (up to markup, spacing and case)."""
    needle = normalize(claim).rstrip(".!?")
    return bool(needle) and needle in normalize(passage)


def overlap(left: Iterable[str], right: Iterable[str]) -> float:
    """The Jaccard overlap of two bags of terms."""
    a, b = set(left), set(right)
    return len(a & b) / len(a | b) if a and b else 0.0


@dataclass(frozen=True, slots=True)
class Chunk:
    """A passage cut from a text: its lines (1-based, inclusive), its page and its text."""

    line_start: int
    line_end: int
    text: str
    page: int | None = None
    prose: bool = True


def _flush(lines: list[tuple[int, str]], prose: bool, page: int | None) -> Iterable[Chunk]:
    for at in range(0, len(lines), MAX_PASSAGE_LINES):
        part = lines[at : at + MAX_PASSAGE_LINES]
        text = "\n".join(line for _, line in part).strip()
        if text:
            yield Chunk(part[0][0], part[-1][0], text, page, prose)


def chunks(text: str, *, page: int | None = None) -> list[Chunk]:
    """Cut ``text`` into passages: paragraphs (blank-line separated), code blocks apart.

    Headings are passages of their own; a paragraph longer than ``MAX_PASSAGE_LINES`` is cut.
    """
    found: list[Chunk] = []
    block: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            if not in_code:
                found.extend(_flush(block, True, page))
                block = []
            block.append((number, line))
            if in_code:
                found.extend(_flush(block, False, page))
                block = []
            in_code = not in_code
            continue
        if in_code:
            block.append((number, line))
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            found.extend(_flush(block, True, page))
            block = []
            if line.strip():
                found.extend(_flush([(number, line)], False, page))
            continue
        block.append((number, line))
    found.extend(_flush(block, not in_code, page))
    return found


def sentences(text: str) -> list[str]:
    """The sentences of a prose passage (list items and table rows each one)."""
    found: list[str] = []
    for piece in re.split(r"\n\s*(?:[-*+]|\d+\.)\s+|\n\|", "\n" + text):
        joined = " ".join(piece.split())
        found.extend(part.strip() for part in _SENTENCE_END.split(joined) if part.strip())
    return found


@dataclass
class Index:
    """A BM25 index over passages (Okapi BM25, k1 = 1.2, b = 0.75)."""

    docs: list[Counter[str]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    df: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, texts: Sequence[str]) -> Index:
        """An index of ``texts`` (their positions are the document numbers)."""
        index = cls()
        for text in texts:
            bag = Counter(terms(text))
            index.docs.append(bag)
            index.lengths.append(sum(bag.values()))
            index.df.update(bag.keys())
        return index

    def scores(self, query: Sequence[str]) -> list[float]:
        """Each document's BM25 score for the query's terms."""
        count = len(self.docs)
        if not count:
            return []
        average = sum(self.lengths) / count or 1.0
        wanted = set(query)
        result: list[float] = []
        for bag, length in zip(self.docs, self.lengths, strict=True):
            score = 0.0
            for term in wanted:
                tf = bag.get(term, 0)
                if not tf:
                    continue
                idf = math.log(1 + (count - self.df[term] + 0.5) / (self.df[term] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
            result.append(score)
        return result
