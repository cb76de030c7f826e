"""The extractive research path: sub-questions, passages, claims, cross-check, report.

No model is involved: a claim is a sentence of a source, cited at the passage it stands in, so a
citation contains its claim by construction; ``check_report`` re-reads the cached bytes and refuses
a report with a sentence whose cited passage does not say it (a wrong citation is worse than none).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stratagem.agents.research._sources import SourceCache, source_text
from stratagem.agents.research._text import (
    Index,
    chunks,
    contains,
    negated,
    normalize,
    overlap,
    sentences,
    terms,
)
from stratagem.agents.research._types import (
    Citation,
    Claim,
    Confidence,
    Location,
    Passage,
    Report,
    Source,
    SubQuestion,
)

__all__ = [
    "CitationError",
    "check_report",
    "claim_id",
    "cross_check",
    "extract_claims",
    "passage_text",
    "passages_of",
    "recall",
    "sub_questions",
    "write_report",
]

PASSAGES_PER_QUESTION = 8
CLAIMS_PER_QUESTION = 5
SUPPORT_OVERLAP = 0.5
"""How much two sentences' terms must overlap (Jaccard) to say the same thing."""
_CITE = re.compile(r"\[(s[0-9]+:(?:p[0-9]+ )?L[0-9]+-[0-9]+)\]")
_SPLIT = re.compile(
    r"\s*(?:;|\?|,?\s+and\s+(?=(?:how|what|why|when|where|which|who|is|are|does|do|can)\b))\s*",
    re.I,
)


class CitationError(ValueError):
    """A report sentence whose citations do not hold (missing, or not containing it).

    Attributes:
        problems: One line per refused sentence.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def claim_id(text: str) -> str:
    """A claim's id: the same text (up to markup and spacing) has the same id."""
    return "c-" + hashlib.sha256(normalize(text).encode()).hexdigest()[:12]


def sub_questions(question: str) -> list[SubQuestion]:
    """The question broken into sub-questions: the whole, then each clause asking on its own."""
    parts = [question.strip()]
    clauses = [part.strip(" ,.") for part in _SPLIT.split(question) if part and part.strip(" ,.")]
    if len(clauses) > 1:
        parts.extend(clauses)
    found: list[SubQuestion] = []
    for part in parts:
        words = list(dict.fromkeys(terms(part)))[:32] or list(dict.fromkeys(terms(question)))[:32]
        if not words or any(sq.terms == words for sq in found):
            continue
        text = part if part.endswith("?") else part + "?"
        found.append(
            SubQuestion(
                id=f"q{len(found) + 1}",
                text=text,
                terms=words,
                acceptance=[
                    f"a claim cited from a passage that speaks of {', '.join(words[:6])}",
                    "each claim's first citation contains it word for word",
                    "each claim cross-checked: supported, contradicted or single-source",
                ],
            )
        )
    if not found:
        raise ValueError("question: it has no words to search for")
    return found


def passages_of(source: Source, cache: SourceCache) -> list[Passage]:
    """Every passage of a read source (code blocks and headings included)."""
    found: list[Passage] = []
    for page, text in source_text(source, cache):
        for chunk in chunks(text, page=page):
            location = Location(line_start=chunk.line_start, line_end=chunk.line_end, page=page)
            found.append(
                Passage(
                    id=f"{source.id}:{location.label()}",
                    source=source.id,
                    digest=source.digest,
                    location=location,
                    text=chunk.text[:20_000],
                )
            )
    return found


def _prose(passage: Passage) -> bool:
    first = passage.text.lstrip()
    return not (first.startswith(("```", "~~~", "#", "|", "<")))


def recall(
    questions: Sequence[SubQuestion], sources: Sequence[Source], cache: SourceCache
) -> list[Passage]:
    """The best passages for each sub-question (BM25 over every read source's prose passages)."""
    pool = [p for s in sources if s.status == "read" for p in passages_of(s, cache) if _prose(p)]
    index = Index.of([p.text for p in pool])
    chosen: dict[str, Passage] = {}
    for question in questions:
        scores = index.scores(question.terms)
        ranked = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        for i in ranked[:PASSAGES_PER_QUESTION]:
            if scores[i] <= 0:
                break
            best = max(scores[i], chosen[pool[i].id].score if pool[i].id in chosen else 0.0)
            chosen[pool[i].id] = pool[i].model_copy(update={"score": round(best, 6)})
    return sorted(chosen.values(), key=lambda p: (-p.score, p.id))


def _claimable(sentence: str) -> bool:
    return (
        25 <= len(sentence) <= 600
        and "|" not in sentence
        and not sentence.endswith((":", ","))
        and (sentence[:1].isalpha() or sentence[:1] == "`")
    )


def _citation(passage: Passage, quote: str) -> Citation:
    return Citation(
        source=passage.source,
        digest=passage.digest,
        location=passage.location,
        passage=passage.id,
        quote=quote,
    )


def extract_claims(questions: Sequence[SubQuestion], passages: Sequence[Passage]) -> list[Claim]:
    """Claims for each sub-question: the recalled passages' sentences that speak of its terms.

    Each claim is cited at the passage it was taken from; the same sentence found twice is one
    claim (its id is its text's digest).
    """
    claims: dict[str, Claim] = {}
    for question in questions:
        wanted = set(question.terms)
        need = min(2, len(wanted))
        scored: list[tuple[float, str, Passage]] = []
        for passage in passages:
            for sentence in sentences(passage.text):
                if not _claimable(sentence) or not contains(passage.text, sentence):
                    continue
                hits = len(wanted & set(terms(sentence)))
                if hits >= need:
                    scored.append((hits / len(wanted) + passage.score / 100, sentence, passage))
        scored.sort(key=lambda item: (-item[0], item[2].id, item[1]))
        taken = 0
        for _, sentence, passage in scored:
            if taken >= CLAIMS_PER_QUESTION:
                break
            cid = claim_id(sentence)
            if cid in claims:
                continue
            claims[cid] = Claim(
                id=cid,
                text=sentence,
                question=question.id,
                citations=[_citation(passage, sentence)],
                confidence=_confidence("single_source", [passage.source], []),
            )
            taken += 1
    return list(claims.values())


@dataclass(frozen=True, slots=True)
class _Said:
    passage: Passage
    sentence: str
    terms: frozenset[str]
    negated: bool


def _everything_said(sources: Iterable[Source], cache: SourceCache) -> list[_Said]:
    said: list[_Said] = []
    for source in sources:
        if source.status != "read":
            continue
        for passage in passages_of(source, cache):
            if not _prose(passage):
                continue
            for sentence in sentences(passage.text):
                if _claimable(sentence) and contains(passage.text, sentence):
                    said.append(
                        _Said(passage, sentence, frozenset(terms(sentence)), negated(sentence))
                    )
    return said


def _confidence(check: str, supporting: Sequence[str], against: Sequence[str]) -> Confidence:
    if check == "contradicted":
        return Confidence(
            level="low",
            score=0.3,
            reason=f"contradicted by {', '.join(against)}",
        )
    if check == "supported":
        return Confidence(
            level="high",
            score=0.9,
            reason=f"supported by {len(supporting)} independent sources: {', '.join(supporting)}",
        )
    return Confidence(
        level="medium", score=0.6, reason=f"single source: {', '.join(supporting)} only"
    )


def cross_check(
    claims: Sequence[Claim], sources: Sequence[Source], cache: SourceCache
) -> list[Claim]:
    """Each claim checked against every other source: supported, contradicted or single-source.

    Two sources are independent when their bytes differ (a copy of a file is not a second
    witness). A sentence of another source whose terms overlap the claim's by half or more says
    the same (supporting citation) or, with the opposite polarity ("not", "never"), the contrary.
    """
    said = _everything_said(sources, cache)
    checked: list[Claim] = []
    for claim in claims:
        first = claim.citations[0]
        mine = frozenset(terms(claim.text))
        polarity = negated(claim.text)
        digests = {first.digest}
        support: list[Citation] = []
        against: list[Citation] = []
        for item in said:
            if item.passage.digest in digests or overlap(mine, item.terms) < SUPPORT_OVERLAP:
                continue
            if item.negated == polarity:
                digests.add(item.passage.digest)
                support.append(_citation(item.passage, item.sentence))
            elif not any(c.digest == item.passage.digest for c in against):
                against.append(_citation(item.passage, item.sentence))
        status = "contradicted" if against else "supported" if support else "single_source"
        sources_for = [first.source, *(c.source for c in support)]
        checked.append(
            claim.model_copy(
                update={
                    "citations": [first, *support],
                    "cross_check": status,
                    "contradicted_by": against,
                    "confidence": _confidence(status, sources_for, [c.source for c in against]),
                }
            )
        )
    return checked


def _marks(citations: Iterable[Citation]) -> str:
    return " ".join(f"[{c.passage}]" for c in citations)


def write_report(
    question: str,
    questions: Sequence[SubQuestion],
    sources: Sequence[Source],
    claims: Sequence[Claim],
) -> Report:
    """The report: findings by sub-question, each sentence with its citations; then the sources."""
    lines = [f"# Research: {question}", "", "## Findings", ""]
    answered: list[str] = []
    for sq in questions:
        mine = [c for c in claims if c.question == sq.id]
        lines += [f"### {sq.id}: {sq.text}", ""]
        if mine:
            answered.append(sq.id)
        else:
            lines.append("_No passage of the sources answers this._")
        for claim in mine:
            lines.append(f"- {claim.text} {_marks(claim.citations)}")
            for against in claim.contradicted_by:
                lines.append(f"  - Said otherwise: {against.quote} {_marks([against])}")
            lines.append(f"  - confidence: {claim.confidence.level} ({claim.confidence.reason})")
        lines.append("")
    lines += ["## Sources", ""]
    for source in sources:
        if source.status == "read":
            lines.append(
                f"- [{source.id}] {source.locator} ({source.digest[:19]}…, {source.size} bytes)"
            )
    unreadable = [s for s in sources if s.status == "unreadable"]
    if unreadable:
        lines += ["", "## Could not be read", ""]
        lines += [f"- [{s.id}] {s.locator}: {s.reason}" for s in unreadable]
    markdown = "\n".join(lines).rstrip() + "\n"
    return Report(
        question=question,
        sub_questions=list(questions),
        sources=list(sources),
        claims=list(claims),
        answered=answered,
        markdown=markdown,
    )


def passage_text(passage_id: str, sources: dict[str, Source], cache: SourceCache) -> str | None:
    source_id, _, where = passage_id.partition(":")
    source = sources.get(source_id)
    match = re.fullmatch(r"(?:p([0-9]+) )?L([0-9]+)-([0-9]+)", where)
    if source is None or source.status != "read" or match is None:
        return None
    page = int(match.group(1)) if match.group(1) else None
    start, end = int(match.group(2)), int(match.group(3))
    for number, text in source_text(source, cache):
        if number == page:
            return "\n".join(text.splitlines()[start - 1 : end])
    return None


def check_report(markdown: str, sources: Sequence[Source], cache: SourceCache) -> None:
    """Refuse a report whose findings hold a sentence its citations do not say.

    Every line of the ``## Findings`` and ``## Synthesis`` sections but headings, empty lines,
    ``confidence:`` notes and the "no passage" note must cite. In the findings, the first cited
    passage (re-read from the cached bytes) must contain the sentence word for word, and any further
    one a sentence saying the same (half its words or more); in the synthesis (a model's), every
    cited passage must say the same.

    Raises:
        CitationError: Naming each refused sentence.
    """
    by_id = {s.id: s for s in sources}
    problems: list[str] = []
    section = ""
    for number, line in enumerate(markdown.splitlines(), start=1):
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        body = line.strip().removeprefix("- ").removeprefix("Said otherwise: ")
        if (
            section not in ("Findings", "Synthesis")
            or not body
            or body.startswith(("#", "confidence:", "_No passage"))
        ):
            continue
        cited = _CITE.findall(body)
        sentence = _CITE.sub("", body).strip()
        if not cited:
            problems.append(f"line {number}: cites nothing: {sentence[:80]}")
            continue
        first = passage_text(cited[0], by_id, cache)
        if section == "Findings" and (first is None or not contains(first, sentence)):
            problems.append(f"line {number}: [{cited[0]}] does not say: {sentence[:80]}")
            continue
        mine = terms(sentence)
        for other in cited[1 if section == "Findings" else 0 :]:
            text = passage_text(other, by_id, cache)
            if text is None or not any(
                overlap(mine, terms(s)) >= SUPPORT_OVERLAP for s in sentences(text)
            ):
                problems.append(f"line {number}: [{other}] does not say: {sentence[:80]}")
    if problems:
        raise CitationError(problems)
