"""The research and debugging types: questions, sources, passages, claims, reports, hypotheses.

These are pydantic models because they cross trust boundaries: a question comes from a user, a
source's text from a file nobody vetted, a plan step's output from the journal, a hypothesis from a
plan file or a model. Each field a user or a model can write is checked here, so a bad value is
refused in one line naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "MAX_QUESTION_CHARS",
    "Citation",
    "Claim",
    "Confidence",
    "ConfidenceLevel",
    "CrossCheck",
    "DecisionRow",
    "Evidence",
    "Hypothesis",
    "Location",
    "Passage",
    "Question",
    "Report",
    "Source",
    "SourceKind",
    "SourceStatus",
    "SubQuestion",
]

MAX_QUESTION_CHARS = 2000
"""The longest question a research goal takes (a question is a sentence or two, not a document)."""

_ID = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
_DIGEST = r"^sha256:[0-9a-f]{64}$"

SourceKind = Literal["path", "mcp"]
"""Where a source comes from: a local file, or an MCP server's tool."""
SourceStatus = Literal["read", "unreadable"]
"""Whether the source's bytes were read and cached (``unreadable``: its ``reason`` says why)."""
CrossCheck = Literal["supported", "contradicted", "single_source"]
"""A claim's cross-check: said by two independent sources, contradicted by one, or said by one."""
ConfidenceLevel = Literal["high", "medium", "low"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SubQuestion(_Model):
    """One verifiable question a research goal is broken into.

    Attributes:
        id: ``q1``, ``q2``, ... in the order asked.
        text: The question.
        terms: The words a passage must speak of to answer it (lowercase, stemmed).
        acceptance: What counts as answered, one criterion a line.
    """

    id: str = Field(pattern=r"^q[0-9]{1,3}$")
    text: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    terms: list[str] = Field(min_length=1, max_length=32)
    acceptance: list[str] = Field(min_length=1, max_length=8)


class Question(_Model):
    """A research question, as a user or a goal file asks it.

    Attributes:
        text: The question, at most ``MAX_QUESTION_CHARS`` characters.
    """

    text: str = Field(min_length=1)

    @field_validator("text")
    @classmethod
    def _bounded(cls, value: str) -> str:
        stripped = value.strip()
        if not stripped:
            raise ValueError("the question is empty")
        if len(stripped) > MAX_QUESTION_CHARS:
            raise ValueError(
                f"the question has {len(stripped)} characters; at most {MAX_QUESTION_CHARS}"
                " are taken (ask a question, not a document)"
            )
        return stripped


class Source(_Model):
    """One source a research goal read (or tried to).

    Attributes:
        id: ``s1``, ``s2``, ... in the order collected.
        locator: What was asked for: a path as given, or ``mcp:SERVER/TOOL``.
        kind: ``path`` or ``mcp``.
        digest: ``sha256:`` of the bytes cached for it; empty when unreadable.
        fetched_at: When its bytes were read (seconds since the epoch).
        status: ``read`` or ``unreadable``.
        reason: Why it could not be read (empty when read).
        media_type: ``text/markdown``, ``text/plain`` or ``application/pdf``.
        size: Its size in bytes (0 when unreadable before reading).
    """

    id: str = Field(pattern=r"^s[0-9]{1,4}$")
    locator: str = Field(min_length=1, max_length=4096)
    kind: SourceKind = "path"
    digest: str = ""
    fetched_at: float = Field(ge=0)
    status: SourceStatus
    reason: str = Field(default="", max_length=500)
    media_type: str = "text/plain"
    size: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Source:
        if self.status == "read":
            if not re.match(_DIGEST, self.digest):
                raise ValueError("digest: a read source has a sha256:<64 hex> digest")
            if self.reason:
                raise ValueError("reason: a read source has no reason")
        elif not self.reason:
            raise ValueError("reason: an unreadable source says why")
        return self


class Location(_Model):
    """Where a passage sits in its source: a line range (1-based, inclusive) and, for a PDF, a page.

    Attributes:
        line_start: Its first line.
        line_end: Its last line.
        page: Its page (1-based) for a PDF; ``None`` for text.
    """

    line_start: int = Field(ge=1)
    line_end: int = Field(ge=1)
    page: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Location:
        if self.line_end < self.line_start:
            raise ValueError("line_end: before line_start")
        return self

    def label(self) -> str:
        """``L12-14`` (or ``p3 L12-14`` on a page)."""
        lines = f"L{self.line_start}-{self.line_end}"
        return lines if self.page is None else f"p{self.page} {lines}"


class Passage(_Model):
    """A passage of a cached source: what a citation points at.

    Attributes:
        id: ``s1:L12-14`` (source and location).
        source: The source's id.
        digest: The digest of the cached bytes it was cut from.
        location: Its lines (and page).
        text: Its text as it stands in the source.
        score: Its recall score for the question that found it (0 when not recalled).
    """

    id: str = Field(min_length=1, max_length=64)
    source: str = Field(pattern=r"^s[0-9]{1,4}$")
    digest: str = Field(pattern=_DIGEST)
    location: Location
    text: str = Field(min_length=1, max_length=20_000)
    score: float = 0.0


class Citation(_Model):
    """A claim's pointer at the bytes it came from.

    Attributes:
        source: The source's id.
        digest: The digest of the cached bytes.
        location: The cited passage's lines (and page).
        passage: The cited passage's id.
        quote: The sentence of the passage that says the claim (the claim itself for the citation
            it was extracted from; a sentence saying the same for a supporting one).
    """

    source: str = Field(pattern=r"^s[0-9]{1,4}$")
    digest: str = Field(pattern=_DIGEST)
    location: Location
    passage: str = Field(min_length=1, max_length=64)
    quote: str = Field(min_length=1, max_length=2000)


class Confidence(_Model):
    """How far a claim is to be trusted, and why.

    Attributes:
        level: ``high`` (two independent sources agree), ``medium`` (one source), ``low``
            (contradicted).
        score: The same as a number in [0, 1].
        reason: One line saying why.
    """

    level: ConfidenceLevel
    score: float = Field(ge=0.0, le=1.0)
    reason: str = Field(min_length=1, max_length=500)


class Claim(_Model):
    """A finding, extracted from a source, with its citations and cross-check.

    Attributes:
        id: ``c-`` and the first 12 hex digits of the sha256 of its normalized text: the same
            claim has the same id in every run (so a resumed run adds no duplicate).
        text: The claim, a sentence as the source says it.
        question: The id of the sub-question it answers.
        citations: Where it is said; the first is the passage it was extracted from.
        cross_check: ``supported``, ``contradicted`` or ``single_source``.
        contradicted_by: For a contradicted claim, the citations that say otherwise.
        confidence: Its confidence and the reason.
    """

    id: str = Field(pattern=r"^c-[0-9a-f]{12}$")
    text: str = Field(min_length=1, max_length=2000)
    question: str = Field(pattern=r"^q[0-9]{1,3}$")
    citations: list[Citation] = Field(min_length=1)
    cross_check: CrossCheck = "single_source"
    contradicted_by: list[Citation] = Field(default_factory=list)
    confidence: Confidence


class Report(_Model):
    """A research goal's result.

    Attributes:
        question: The question asked.
        sub_questions: What it was broken into.
        sources: Every source, read or not.
        claims: The claims, in the order the report states them.
        answered: The ids of the sub-questions whose acceptance criteria hold.
        markdown: The report as Markdown: every sentence of its findings cites its sources.
        digest: The digest of ``markdown`` as cached (empty when not cached).
        known: The knowledge base's claims on the question from earlier goals (their ids).
        refused: The model's synthesis sentences refused (one line each: the passage and what
            it does not say); empty without a model.
    """

    question: str
    sub_questions: list[SubQuestion]
    sources: list[Source]
    claims: list[Claim]
    answered: list[str] = Field(default_factory=list)
    markdown: str
    digest: str = ""
    known: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)

    @property
    def unreadable(self) -> list[Source]:
        """The sources that could not be read."""
        return [source for source in self.sources if source.status == "unreadable"]


_Probability = Annotated[float, Field(gt=0.0, lt=1.0)]


class Evidence(_Model):
    """One observation for or against a hypothesis.

    Attributes:
        hypothesis: The hypothesis' id.
        direction: ``for`` or ``against``.
        strength: The likelihood ratio of the observation (how many times likelier it is when the
            hypothesis holds, for ``for``; when it does not, for ``against``); above 1.
        note: What was observed.
        step: The plan step that observed it (``plan_id:step_id``), if any.
        artifact: The digest of the artifact that shows it, if any.
        claim: The knowledge-base claim it rests on, if any.
    """

    hypothesis: str = Field(pattern=r"^H[0-9]{1,3}$")
    direction: Literal["for", "against"]
    strength: float = Field(default=3.0, gt=1.0, le=1000.0)
    note: str = Field(min_length=1, max_length=2000)
    step: str = Field(default="", max_length=200)
    artifact: str = Field(default="", pattern=r"^(|sha256:[0-9a-f]{64})$")
    claim: str = Field(default="", pattern=r"^(|c-[0-9a-f]{12})$")

    @model_validator(mode="after")
    def _linked(self) -> Evidence:
        if not (self.step or self.artifact or self.claim):
            raise ValueError("evidence links to a step, an artifact or a claim (none given)")
        return self


class Hypothesis(_Model):
    """A possible root cause, with what testing it costs.

    Attributes:
        id: ``H1``, ``H2``, ...
        statement: What would be true.
        rationale: Why it is plausible.
        prior: Its likelihood before any evidence, in (0, 1).
        test_cost: What testing it costs (minutes of work, or any unit used consistently).
        test: How it is tested (a command, a step), with the observation that decides it.
    """

    id: str = Field(pattern=r"^H[0-9]{1,3}$")
    statement: str = Field(min_length=1, max_length=2000)
    rationale: str = Field(min_length=1, max_length=2000)
    prior: _Probability
    test_cost: float = Field(gt=0.0, le=1e6)
    test: str = Field(default="", max_length=2000)


class DecisionRow(_Model):
    """One row of a decision table: a test's outcome and the plan step it leads to.

    Attributes:
        hypothesis: The hypothesis the test decides.
        test_step: The plan step that runs the test.
        outcome: ``pass`` (the observation confirms it) or ``fail``.
        when: The plan-language condition that is true on that outcome (an expression over the
            test step's output, as a step's ``when``).
        next_step: The plan step the outcome leads to.
    """

    hypothesis: str = Field(pattern=r"^H[0-9]{1,3}$")
    test_step: str = Field(pattern=_ID)
    outcome: Literal["pass", "fail"]
    when: str = Field(min_length=1, max_length=500)
    next_step: str = Field(pattern=_ID)
