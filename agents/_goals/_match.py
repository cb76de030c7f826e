"""Matching a goal's clauses to the directory: clause split, scoring, slot extraction.

A goal is split into clauses at ``;``, sentence ends, commas, ``and then``, ``then``, ``and``,
``also`` and ``after that``, a ``please`` at either end dropped (``split_clauses``). Each clause
is scored against every intent of the directory (``Bm25``); a capability's score is its best
intent's, and a tie goes to the cheaper capability.
The best intent's slots are read from the clause (``extract_slots``): the words between the
literal words around the slot in the phrasing, typed by the request field (a whole number, a
number, a boolean, one of an enum's values, or text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from stratagem.agents._goals._bm25 import Bm25, tokens
from stratagem.agents._goals._directory import CapabilityDirectory, DirectoryEntry
from stratagem.protocol import Intent
from stratagem.protocol._intents import SlotType

__all__ = [
    "MATCH_THRESHOLD",
    "Clause",
    "Match",
    "Matcher",
    "extract_slots",
    "split_clauses",
]

MATCH_THRESHOLD: Final = 0.55
"""The least score a clause's best capability needs to be chosen."""

_SPLIT: Final = re.compile(
    r"\s*(?:;|\.\s+|,\s*and\s+then\s+|,\s*then\s+|\s+and\s+then\s+|\s+then\s+|,\s*and\s+|"
    r"\s+and\s+|,\s*also\s+|\s+after\s+that\s+|,\s+)\s*",
    re.IGNORECASE,
)
_THEN: Final = re.compile(r"\b(then|after that)\b", re.IGNORECASE)
_PLEASE: Final = re.compile(r"^(?:please\b[\s,]*)+|(?:[\s,]*\bplease)+$", re.IGNORECASE)
_NUMBER_WORDS: Final = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
_NUMBER: Final = re.compile(r"^[+-]?\d+(?:\.\d+)?$")
_ARTICLES: Final = ("the ", "a ", "an ", "my ")


@dataclass(frozen=True, slots=True)
class Clause:
    """One clause of a goal: its text, whether it says it comes after the one before, and the
    separator before it as written (to join it back when it is no clause of its own)."""

    text: str
    after_previous: bool
    sep: str = ""


def split_clauses(goal: str) -> list[Clause]:
    """``goal``'s clauses in order (empty pieces dropped)."""
    clauses: list[Clause] = []
    text = goal.strip().rstrip(".!?")
    at, then, before = 0, False, ""
    for sep in _SPLIT.finditer(text):
        piece = _PLEASE.sub("", text[at : sep.start()].strip(" ,"))
        if piece:
            clauses.append(Clause(piece, then and bool(clauses), before))
            then, before = False, ""
        then = then or bool(_THEN.search(sep.group(0)))
        before += sep.group(0)
        at = sep.end()
    tail = _PLEASE.sub("", text[at:].strip(" ,"))
    if tail:
        clauses.append(Clause(tail, then and bool(clauses), before))
    return clauses


@dataclass(frozen=True, slots=True)
class Match:
    """A capability chosen for a clause.

    Attributes:
        entry: The capability.
        intent: The intent that matched best.
        score: Its score, 0-1.
    """

    entry: DirectoryEntry
    intent: Intent
    score: float


class Matcher:
    """Scores clauses against a directory's intents (one BM25 index over every phrasing)."""

    def __init__(self, directory: CapabilityDirectory) -> None:
        self.directory = directory
        self._index: list[tuple[DirectoryEntry, Intent]] = [
            (entry, intent) for entry in directory.entries for intent in entry.intents
        ]
        self._bm25 = Bm25([tokens(intent.text) for _, intent in self._index])

    def ranked(self, clause: str, *, agent: str | None = None) -> list[Match]:
        """Every capability's best match for ``clause``, best first (ties: cheaper first, then
        directory order); only ``agent``'s when it is given."""
        scores = self._bm25.scores(tokens(clause))
        best: dict[str, Match] = {}
        for (entry, intent), score in zip(self._index, scores, strict=True):
            if agent is not None and (entry.external or entry.agent) != agent:
                continue
            known = best.get(entry.name)
            if known is None or score > known.score:
                best[entry.name] = Match(entry, intent, round(score, 4))
        order = {e.name: i for i, e in enumerate(self.directory.entries)}
        return sorted(
            best.values(), key=lambda m: (-m.score, m.entry.spec.cost, order[m.entry.name])
        )


def _typed(kind: SlotType, schema: dict[str, Any], words: list[str]) -> Any:
    """The value of a slot of type ``kind`` in ``words``, or ``None`` when none fits."""
    if kind in ("integer", "number"):
        for word in words:
            clean = word.strip(",.;:!?")
            if _NUMBER.match(clean):
                value = float(clean)
                if kind == "integer":
                    return int(value) if value.is_integer() else None
                return value
            if clean.lower() in _NUMBER_WORDS:
                return _NUMBER_WORDS[clean.lower()]
        return None
    if kind == "boolean":
        for word in words:
            low = word.lower().strip(",.;:!?")
            if low in ("yes", "true", "on"):
                return True
            if low in ("no", "false", "off"):
                return False
        return None
    if kind == "enum":
        values = schema.get("enum", [schema.get("const")])
        text = " ".join(words).lower()
        for value in values:
            if isinstance(value, str) and re.search(rf"\b{re.escape(value.lower())}\b", text):
                return value
        return None
    text = " ".join(words).strip(" ,.;:!?\"'")
    low = text.lower()
    for article in _ARTICLES:
        if low.startswith(article):
            text = text[len(article) :]
            break
    return text or None


def _find(words: list[str], needle: list[str], start: int) -> int:
    """Where ``needle`` (lowercased words) starts in ``words`` at or after ``start``; -1."""
    n = len(needle)
    for i in range(start, len(words) - n + 1):
        if [w.lower().strip(",.;:!?") for w in words[i : i + n]] == needle:
            return i
    return -1


def extract_slots(clause: str, match: Match) -> dict[str, Any]:
    """The slots of ``match``'s intent found in ``clause``, typed by its request fields.

    For each slot, the words between the phrasing's literal words around it are read (the last
    word before the slot, the first after it); a number slot takes the first number there, or in
    the clause when the words around it are not found; an enum slot takes a value of the enum
    named anywhere in the clause.
    """
    words = clause.split()
    parts = match.intent.parts
    found: dict[str, Any] = {}
    at = 0
    for i, (kind, value) in enumerate(parts):
        if kind != "slot":
            continue
        slot_kind, schema = match.entry.slots[value]
        before = parts[i - 1][1].lower().split()[-1:] if i > 0 else []
        after = parts[i + 1][1].lower().split()[:1] if i + 1 < len(parts) else []
        start = at
        if before:
            hit = _find(words, before, at)
            start = hit + 1 if hit >= 0 else -1
        if start < 0:
            if slot_kind in ("integer", "number", "enum", "boolean"):
                # An enum's value may stand anywhere in the clause; a number after the last slot.
                typed = _typed(slot_kind, schema, words if slot_kind == "enum" else words[at:])
                if typed is not None:
                    found[value] = typed
            continue
        end = len(words)
        if after:
            hit = _find(words, after, start + 1 if slot_kind != "string" else start)
            if hit > start:
                end = hit
        typed = _typed(slot_kind, schema, words[start:end])
        if typed is None and slot_kind != "string":
            typed = _typed(slot_kind, schema, words if slot_kind == "enum" else words[at:])
        if typed is not None:
            found[value] = typed
            at = end
    return found
