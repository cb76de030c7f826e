"""Research as a durable plan: one step per stage and per source, run by the engine like any plan.

``research_plan`` writes the plan (visible, journaled, resumable); ``research_tools`` are the tools
its steps call, bound to a cache, a fetch ledger and the file scopes (never taken from the plan: a
plan cannot widen what it may read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from stratagem.agents._tool import Tool, in_thread, tool
from stratagem.agents.research._findings import (
    CitationError,
    check_report,
    cross_check,
    extract_claims,
    passage_text,
    recall,
    sub_questions,
    write_report,
)
from stratagem.agents.research._kb import KbEntry, KnowledgeBase
from stratagem.agents.research._model import ModelResearcher
from stratagem.agents.research._sources import (
    MCP_PREFIX,
    FetchLedger,
    FileScopes,
    SourceCache,
    ToolCaller,
    fetch_mcp,
    fetch_path,
)
from stratagem.agents.research._types import Claim, Passage, Question, Report, Source, SubQuestion
from stratagem.planning import LogicError, Plan, ToolContext, ToolStep

__all__ = ["RESEARCH_TOOLS", "research_plan", "research_tools"]

RESEARCH_TOOLS = (
    "research_scope",
    "research_collect",
    "research_recall",
    "research_claims",
    "research_crosscheck",
    "research_report",
)
"""The names of the research tools, in the order a research plan calls them."""


class _SubQuestions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sub_questions: list[SubQuestion]


class _Passages(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    passages: list[Passage]


class _Claims(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    claims: list[Claim]


def research_plan(
    question: str,
    files: Sequence[str],
    *,
    plan_id: str,
    owner: str = "perception",
    model_timeout_s: float = 0.0,
) -> Plan:
    """The plan that researches ``question`` over ``files`` (already expanded and in scope).

    Steps: ``scope`` (sub-questions), ``collect-N`` (one per file: read once, cached), ``recall``
    (passages), ``claims``, ``crosscheck``, ``report``. ``model_timeout_s`` (when the owner
    researches with a model: its first call and each repair) is the limit of the two steps a model
    writes, ``scope`` and ``report``; otherwise they have the engine's default.

    Raises:
        pydantic.ValidationError: The question is empty or longer than ``MAX_QUESTION_CHARS``.
    """
    text = Question(text=question).text
    model_limit = model_timeout_s if model_timeout_s > 0 else None
    collects = [f"collect-{n}" for n in range(1, len(files) + 1)]
    sources = [{"$ref": step} for step in collects]
    steps: list[Any] = [
        ToolStep(id="scope", title="break the question into sub-questions",
                 tool="research_scope", input={"question": text}, timeout_s=model_limit),
        *(
            ToolStep(id=step, title=f"read {path}", tool="research_collect",
                     input={"locator": path, "index": n})
            for n, (step, path) in enumerate(zip(collects, files, strict=True), start=1)
        ),
        ToolStep(id="recall", title="recall passages", tool="research_recall",
                 depends_on=["scope", *collects],
                 input={"sub_questions": {"$ref": "scope.sub_questions"}, "sources": sources}),
        ToolStep(id="claims", title="extract claims with citations", tool="research_claims",
                 depends_on=["scope", "recall"],
                 input={"sub_questions": {"$ref": "scope.sub_questions"},
                        "passages": {"$ref": "recall.passages"}}),
        ToolStep(id="crosscheck", title="cross-check each claim", tool="research_crosscheck",
                 depends_on=["claims", *collects],
                 input={"claims": {"$ref": "claims.claims"}, "sources": sources}),
        ToolStep(id="report", title="write the report", tool="research_report",
                 depends_on=["scope", "crosscheck", *collects], timeout_s=model_limit,
                 input={"question": text, "sub_questions": {"$ref": "scope.sub_questions"},
                        "sources": sources, "claims": {"$ref": "crosscheck.claims"}}),
    ]  # fmt: skip
    return Plan(id=plan_id, owner=owner, goal=f"research: {text}"[:500], steps=steps)


def research_tools(
    cache: SourceCache,
    ledger: FetchLedger,
    scopes: FileScopes,
    kb: KnowledgeBase | None = None,
    model: ModelResearcher | None = None,
    call_tool: ToolCaller | None = None,
    mcp_timeout_s: float = 30.0,
) -> list[Tool[Any, Any]]:
    """The research plan's tools, bound to where sources are cached and what may be read, the
    knowledge base the report step keeps its claims in (and reads what was known before), and the
    model (if any) that writes the sub-questions and a synthesis, each checked, and how an MCP
    source's tool is called (``call_tool``, within ``mcp_timeout_s``)."""

    @tool(name="research_scope")
    async def scope(question: str) -> _SubQuestions:
        """Break a research question into sub-questions with acceptance criteria."""
        try:
            text = Question(text=question).text
            if model is not None:
                return _SubQuestions(sub_questions=await model.sub_questions(text))
            return _SubQuestions(sub_questions=sub_questions(text))
        except ValueError as exc:
            raise LogicError(f"question: {exc}") from exc

    @tool(name="research_collect", side_effects=True, idempotent=True)
    async def collect(locator: str, index: int, ctx: ToolContext) -> Source:
        """Read one source (a file within the file scopes, or an MCP server's tool) and cache
        its bytes (once per plan)."""
        known = ledger.recorded(ctx.plan_id, locator)
        if known is not None:
            return known
        if locator.startswith(MCP_PREFIX):
            source = await fetch_mcp(
                f"s{index}", locator, call_tool, cache, ctx, timeout_s=mcp_timeout_s
            )
        else:
            source = await in_thread(
                lambda should_stop: fetch_path(f"s{index}", locator, scopes, cache, ctx)
            )
        ledger.record(ctx.plan_id, locator, source)
        return source

    @tool(name="research_recall")
    async def recall_passages(sub_questions: list[SubQuestion], sources: list[Source]) -> _Passages:
        """Recall the passages that speak of each sub-question (full text, BM25)."""
        found = await in_thread(lambda should_stop: recall(sub_questions, sources, cache))
        return _Passages(passages=found)

    @tool(name="research_claims")
    async def claims(sub_questions: list[SubQuestion], passages: list[Passage]) -> _Claims:
        """Extract claims from the recalled passages, each cited where it is said."""
        return _Claims(claims=extract_claims(sub_questions, passages))

    @tool(name="research_crosscheck")
    async def crosscheck(claims: list[Claim], sources: list[Source]) -> _Claims:
        """Cross-check each claim against the other sources; give its confidence."""
        checked = await in_thread(lambda should_stop: cross_check(claims, sources, cache))
        return _Claims(claims=checked)

    @tool(name="research_report", side_effects=True, idempotent=True)
    async def report(
        question: str,
        sub_questions: list[SubQuestion],
        sources: list[Source],
        claims: list[Claim],
        ctx: ToolContext,
    ) -> Report:
        """Write the Markdown report, check every citation, and cache it as an artifact."""
        written = write_report(question, sub_questions, sources, claims)
        if model is not None and claims:
            written = await with_synthesis(written, model, cache)
        if kb is not None:
            mine = {claim.id for claim in claims}
            known = [e for e in await kb.search(question, limit=10) if e.id not in mine]
            written = with_known(written, known)
        try:
            await in_thread(lambda should_stop: check_report(written.markdown, sources, cache))
        except CitationError as exc:
            raise LogicError(f"report: citations refused: {exc}") from exc
        digest = cache.put(
            written.markdown.encode(),
            name="report.md",
            media_type="text/markdown",
            ctx=ctx,
            tool="research_report",
        )
        if kb is not None:
            await kb.keep(written, ctx.plan_id)
        return written.model_copy(update={"digest": digest})

    return [scope, collect, recall_passages, claims, crosscheck, report]


def with_known(report: Report, known: Sequence[KbEntry]) -> Report:
    """The report with what the knowledge base knew before: an "Already known" section (each claim
    with its id, confidence and the plans that found it) and ``known`` (their ids)."""
    if not known:
        return report
    lines = ["", "## Already known", ""]
    for entry in known:
        flags = "".join(
            f", {flag}"
            for flag, on in (("contradicted", entry.contradicts), ("stale", entry.stale))
            if on
        )
        lines.append(
            f"- {entry.claim} (kb {entry.id}, confidence {entry.confidence}{flags}; found by "
            f"{', '.join(entry.plans)})"
        )
    head, sep, tail = report.markdown.partition("\n## Sources")
    markdown = head.rstrip("\n") + "\n" + "\n".join(lines) + "\n" + sep + tail
    return report.model_copy(update={"markdown": markdown, "known": [e.id for e in known]})


async def with_synthesis(report: Report, model: ModelResearcher, cache: SourceCache) -> Report:
    """The report with the model's synthesis after its findings: only sentences every cited
    passage says (the rest listed in ``refused``)."""
    by_id = {s.id: s for s in report.sources}
    passages: dict[str, str] = {}
    for claim in report.claims:
        for citation in claim.citations:
            text = passage_text(citation.passage, by_id, cache)
            if text is not None:
                passages[citation.passage] = text
    synthesis = await model.synthesize(report.question, report.claims, passages)
    if not synthesis.sentences:
        return report.model_copy(update={"refused": list(synthesis.refused)})
    lines = ["## Synthesis", ""]
    lines += [f"- {s.text} " + " ".join(f"[{c}]" for c in s.cites) for s in synthesis.sentences]
    head, sep, tail = report.markdown.partition("\n## Sources")
    markdown = head.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n" + sep + tail
    return report.model_copy(update={"markdown": markdown, "refused": list(synthesis.refused)})
