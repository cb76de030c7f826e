"""The knowledge base: claims with their citations and confidence, kept in the deployment's memory.

Each claim is one memory item (namespace ``agent/perception/kb``, key its claim id), so the
knowledge base is scoped, policy-checked, audited and kept like memory, recalled by its full-text
search, and written again by a resumed plan without a duplicate (the same claim has the same key).
A claim another kept claim contradicts is flagged on both; a claim whose cited source's bytes
changed is flagged stale when read (``with_staleness``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._memory import JsonValue, MemoryItem
from stratagem.agents.research._text import negated, overlap, terms
from stratagem.agents.research._types import Claim, CrossCheck, Report, Source

__all__ = [
    "KB_NAMESPACE",
    "Items",
    "KbCitation",
    "KbEntry",
    "KnowledgeBase",
    "kb_export",
    "kb_markdown",
    "with_staleness",
]

KB_NAMESPACE = ("agent", "perception", "kb")
"""Where the knowledge base is kept: the perception agent's own memory (the default policy lets
each agent read and write ``agent/<its role>``, the operator every namespace)."""


class Items(Protocol):
    """What the knowledge base and the investigations use of a memory: a ``MemoryStore``, or the
    ``PolicedMemory`` over it that checks the policy and audits each write."""

    async def put(
        self, namespace: Sequence[str], key: str, value: JsonValue, *, ttl_s: float | None = None
    ) -> MemoryItem: ...

    async def get(self, namespace: Sequence[str], key: str) -> MemoryItem | None: ...

    async def list(
        self, namespace: Sequence[str], *, limit: int = 100, offset: int = 0
    ) -> Sequence[MemoryItem]: ...

    async def search(
        self,
        namespace: Sequence[str],
        query: str | None = None,
        *,
        filter: Mapping[str, JsonValue] | None = None,
        limit: int = 10,
    ) -> Sequence[MemoryItem]: ...


CONTRADICTION_OVERLAP = 0.5


class KbCitation(BaseModel):
    """Where a kept claim is said: the source as read, its digest then, and the lines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    locator: str
    digest: str
    location: str
    quote: str


class KbEntry(BaseModel):
    """One claim of the knowledge base.

    Attributes:
        id: The claim's id (``c-`` + 12 hex of its normalized text).
        claim: The claim.
        question: The sub-question it answered when it was found.
        confidence: ``high``, ``medium`` or ``low``.
        score: The confidence as a number.
        reason: Why that confidence.
        cross_check: ``supported``, ``contradicted`` or ``single_source``.
        citations: Where it is said.
        plans: The research plans that found it, oldest first.
        contradicts: Kept claims that say otherwise.
        stale: A cited source's bytes changed (or it is gone) since it was read.
        stale_reason: Which, and how.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    claim: str
    question: str = ""
    confidence: str
    score: float
    reason: str
    cross_check: CrossCheck
    citations: list[KbCitation]
    plans: list[str] = Field(default_factory=list)
    contradicts: list[str] = Field(default_factory=list)
    stale: bool = False
    stale_reason: str = ""


def _entry(claim: Claim, sources: dict[str, Source], question: str, plan_id: str) -> KbEntry:
    return KbEntry(
        id=claim.id,
        claim=claim.text,
        question=question,
        confidence=claim.confidence.level,
        score=claim.confidence.score,
        reason=claim.confidence.reason,
        cross_check=claim.cross_check,
        citations=[
            KbCitation(
                locator=sources[c.source].locator if c.source in sources else c.source,
                digest=c.digest,
                location=c.location.label(),
                quote=c.quote,
            )
            for c in claim.citations
        ],
        plans=[plan_id],
    )


class KnowledgeBase:
    """Claims kept across research goals, in a memory under ``namespace`` (``KB_NAMESPACE``)."""

    def __init__(self, store: Items, *, namespace: Sequence[str] = KB_NAMESPACE) -> None:
        self.store = store
        self.namespace = tuple(namespace)

    async def get(self, claim_id: str) -> KbEntry | None:
        """One kept claim, or ``None``."""
        item = await self.store.get(self.namespace, claim_id)
        return None if item is None else KbEntry.model_validate(item.value)

    async def entries(self, *, limit: int = 1000) -> list[KbEntry]:
        """Every kept claim (at most ``limit``), by id."""
        items = await self.store.list(self.namespace, limit=limit)
        return [KbEntry.model_validate(item.value) for item in items]

    async def search(self, query: str, *, limit: int = 10) -> list[KbEntry]:
        """The kept claims best matching ``query`` (the memory's full-text recall)."""
        items = await self.store.search(self.namespace, query, limit=limit)
        return [KbEntry.model_validate(item.value) for item in items]

    async def _put(self, entry: KbEntry) -> None:
        value: Any = entry.model_dump(mode="json")
        await self.store.put(self.namespace, entry.id, value)

    async def keep(self, report: Report, plan_id: str) -> list[KbEntry]:
        """Keep a report's claims: new ones added, known ones given this plan (once), and each
        pair of kept claims that say opposite things flagged on both. The claims as kept."""
        sources = {s.id: s for s in report.sources}
        questions = {q.id: q.text for q in report.sub_questions}
        kept: list[KbEntry] = []
        for claim in report.claims:
            entry = _entry(claim, sources, questions.get(claim.question, ""), plan_id)
            known = await self.get(claim.id)
            if known is not None:
                plans = known.plans if plan_id in known.plans else [*known.plans, plan_id]
                entry = entry.model_copy(update={"plans": plans, "contradicts": known.contradicts})
            entry = await self._contradictions(entry)
            await self._put(entry)
            kept.append(entry)
        return kept

    async def _contradictions(self, entry: KbEntry) -> KbEntry:
        mine = terms(entry.claim)
        polarity = negated(entry.claim)
        found = list(entry.contradicts)
        for other in await self.search(" ".join(dict.fromkeys(mine)), limit=20):
            if other.id == entry.id or other.id in found:
                continue
            if overlap(mine, terms(other.claim)) >= CONTRADICTION_OVERLAP and (
                negated(other.claim) != polarity
            ):
                found.append(other.id)
                if entry.id not in other.contradicts:
                    await self._put(
                        other.model_copy(update={"contradicts": [*other.contradicts, entry.id]})
                    )
        return entry.model_copy(update={"contradicts": found})


def with_staleness(
    entries: Sequence[KbEntry], digest_of: Callable[[str], str | None]
) -> list[KbEntry]:
    """The entries with ``stale`` set where a cited source's digest now differs (``digest_of``:
    a locator's digest now, ``None`` when it cannot be read)."""
    now: dict[str, str | None] = {}
    marked: list[KbEntry] = []
    for entry in entries:
        reasons: list[str] = []
        for citation in entry.citations:
            if citation.locator not in now:
                now[citation.locator] = digest_of(citation.locator)
            digest = now[citation.locator]
            if digest is None:
                reasons.append(f"{citation.locator} can no longer be read")
            elif digest != citation.digest:
                reasons.append(f"{citation.locator} changed since it was read")
        marked.append(
            entry.model_copy(update={"stale": bool(reasons), "stale_reason": "; ".join(reasons)})
        )
    return marked


def kb_markdown(entries: Sequence[KbEntry]) -> str:
    """The knowledge base for people: each claim, its confidence and flags, its citations."""
    lines = ["# Knowledge base", ""]
    for entry in entries:
        flags = [f for f, on in (("stale", entry.stale), ("contradicted", entry.contradicts)) if on]
        lines.append(f"## {entry.id}" + (f" ({', '.join(flags)})" if flags else ""))
        lines += ["", entry.claim, ""]
        lines.append(f"- confidence: {entry.confidence} ({entry.reason})")
        for citation in entry.citations:
            lines.append(
                f"- cited: {citation.locator} {citation.location} ({citation.digest[:19]}…)"
            )
        if entry.contradicts:
            lines.append(f"- contradicted by: {', '.join(entry.contradicts)}")
        if entry.stale:
            lines.append(f"- stale: {entry.stale_reason}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def kb_export(entries: Sequence[KbEntry], fmt: Literal["json", "yaml", "md"]) -> str:
    """The entries as JSON, YAML or Markdown."""
    data = [entry.model_dump(mode="json") for entry in entries]
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return kb_markdown(entries)
