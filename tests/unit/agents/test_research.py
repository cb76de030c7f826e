"""The research types and the extractive research path, over small corpora the tests write
(docs/research.md: its guarantees, and its hypothesis example with these numbers)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from stratagem.agents import InMemoryMemoryStore, ToolRegistry, research
from stratagem.agents.research import (
    CitationError,
    DecisionRow,
    Evidence,
    FetchLedger,
    FileScopes,
    Hypothesis,
    HypothesisTracker,
    InMemorySourceCache,
    KnowledgeBase,
    Question,
    Report,
    SourceRefusedError,
    check_report,
    cross_check,
    expand_sources,
    extract_claims,
    fetch_path,
    kb_export,
    recall,
    research_plan,
    research_tools,
    sub_questions,
    with_staleness,
    write_report,
)
from stratagem.planning import Engine, InMemoryStateStore, validate_plan

EXPORTS = [
    "HYPOTHESIS_TOOLS",
    "KB_NAMESPACE",
    "MAX_FILES",
    "MAX_PDF_PAGES",
    "MAX_QUESTION_CHARS",
    "MAX_SOURCE_BYTES",
    "MCP_PREFIX",
    "RESEARCH_TOOLS",
    "ArtifactSourceCache",
    "Citation",
    "CitationError",
    "Claim",
    "Confidence",
    "ConfidenceLevel",
    "CrossCheck",
    "DebugContext",
    "DecisionRow",
    "DirectorySourceCache",
    "Evidence",
    "FetchLedger",
    "FileScopes",
    "Hypothesis",
    "HypothesisState",
    "HypothesisTracker",
    "InMemorySourceCache",
    "Investigation",
    "Investigations",
    "KbCitation",
    "KbEntry",
    "KnowledgeBase",
    "Location",
    "ModelResearcher",
    "Passage",
    "Question",
    "Report",
    "Source",
    "SourceCache",
    "SourceKind",
    "SourceRefusedError",
    "SourceStatus",
    "SubQuestion",
    "Synthesis",
    "SynthesisSentence",
    "ToolCaller",
    "check_report",
    "claim_id",
    "cross_check",
    "expand_sources",
    "extract_claims",
    "fetch_mcp",
    "fetch_path",
    "hypothesis_tools",
    "kb_export",
    "kb_markdown",
    "mcp_tool",
    "passages_of",
    "postmortem_markdown",
    "recall",
    "research_plan",
    "research_tools",
    "source_text",
    "sub_questions",
    "with_staleness",
    "write_report",
]

RESUME = """# Resuming

A plan that stopped in a crash is resumed from its journal.

Resume skips completed steps and re-runs an in-flight step only when it is idempotent.
"""
RESUME_TOO = """# Notes

After a crash, resume skips completed steps and re-runs an in-flight step when it is idempotent.
"""
RESUME_NOT = """# Other notes

Resume never skips completed steps and re-runs an in-flight step when it is idempotent.
"""


def _corpus(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for name, body in files.items():
        path = root / name
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return root


def _read(root: Path, cache: InMemorySourceCache) -> list[research.Source]:
    scopes = FileScopes.of([root])
    files = expand_sources([str(root)], scopes, base=root)
    return [fetch_path(f"s{n}", path, scopes, cache) for n, path in enumerate(files, start=1)]


def test_exports_are_pinned_and_documented() -> None:
    assert research.__all__ == EXPORTS
    for name in EXPORTS:
        value = getattr(research, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert inspect.getdoc(value), name


def test_a_question_of_100_kb_is_refused_in_one_line_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        Question(text="w" * 100_000)
    (error,) = caught.value.errors()
    assert error["loc"] == ("text",)
    assert "100000 characters; at most 2000" in error["msg"]
    with pytest.raises(ValidationError):
        research_plan("x" * 100_000, [], plan_id="r")


def test_a_source_outside_the_file_scopes_is_refused_naming_it(tmp_path: Path) -> None:
    inside = _corpus(tmp_path, {"a.md": RESUME})
    outside = tmp_path / "secret.txt"
    outside.write_text("the password is swordfish\n")
    scopes = FileScopes.of([inside])
    with pytest.raises(SourceRefusedError, match=r"secret\.txt: outside the allowed file scopes"):
        expand_sources([str(outside)], scopes, base=inside)
    with pytest.raises(SourceRefusedError, match="outside the allowed file scopes"):
        expand_sources(["../secret.txt"], scopes, base=inside)
    # The tool refuses it too (a plan written by hand cannot widen the scopes).
    cache = InMemorySourceCache()
    source = fetch_path("s1", str(outside), scopes, cache)
    assert (source.status, source.reason) == ("unreadable", "outside the allowed file scopes")
    assert cache.blobs == {}


def test_a_link_out_of_the_scopes_is_refused(tmp_path: Path) -> None:
    inside = _corpus(tmp_path, {"a.md": RESUME})
    outside = tmp_path / "secret.txt"
    outside.write_text("the password is swordfish\n")
    (inside / "link.md").symlink_to(outside)
    scopes = FileScopes.of([inside])
    assert expand_sources([str(inside)], scopes, base=inside) == [str(inside / "a.md")]
    source = fetch_path("s1", str(inside / "link.md"), scopes, InMemorySourceCache())
    assert source.status == "unreadable"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00", "a binary file (it holds NUL bytes), not text"),
        (b"caf\xe9 au lait\n", "not UTF-8 text (byte 3)"),
    ],
)
def test_a_binary_or_undecodable_file_is_recorded_as_unreadable(
    tmp_path: Path, body: bytes, reason: str
) -> None:
    root = _corpus(tmp_path, {"x.txt": body})
    (source,) = _read(root, InMemorySourceCache())
    assert (source.status, source.reason, source.digest) == ("unreadable", reason, "")


def test_an_unreadable_or_oversized_file_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _corpus(tmp_path, {"big.md": "word " * 100, "gone.md": RESUME})
    scopes = FileScopes.of([root])
    monkeypatch.setattr("stratagem.agents.research._sources.MAX_SOURCE_BYTES", 100)
    big = fetch_path("s1", str(root / "big.md"), scopes, InMemorySourceCache())
    assert big.reason == "larger than 100 bytes (500)"
    (root / "gone.md").unlink()
    gone = fetch_path("s2", str(root / "gone.md"), scopes, InMemorySourceCache())
    assert gone.reason == "No such file or directory"


def _pdf(pages: int, text: str = "") -> bytes:
    import io

    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=72, height=72)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_pdf_bomb_is_refused_by_its_page_count(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"bomb.pdf": _pdf(research.MAX_PDF_PAGES + 1), "ok.pdf": _pdf(2)})
    bomb, ok = _read(root, InMemorySourceCache())
    assert bomb.reason == "a PDF of 201 pages; at most 200 are read"
    assert (ok.status, ok.media_type) == ("read", "application/pdf")


def test_a_damaged_pdf_is_recorded_as_unreadable(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"bad.pdf": b"%PDF-1.7\nnot a pdf at all\n"})
    (source,) = _read(root, InMemorySourceCache())
    assert source.status == "unreadable"
    assert source.reason.startswith("an unreadable PDF")


def test_claims_cite_the_passage_that_says_them_and_are_cross_checked(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME, "b.md": RESUME_TOO, "copy.md": RESUME})
    cache = InMemorySourceCache()
    sources = _read(root, cache)
    questions = sub_questions("How does a plan resume after a crash?")
    claims = cross_check(
        extract_claims(questions, recall(questions, sources, cache)), sources, cache
    )
    by_text = {c.text: c for c in claims}
    said = (
        "After a crash, resume skips completed steps and re-runs an in-flight step when it is"
        " idempotent."
    )
    claim = by_text[said]
    # b.md says it; a.md says the same; copy.md holds a.md's bytes: one witness, not two.
    assert claim.cross_check == "supported"
    assert [c.source for c in claim.citations] == ["s2", "s1"]
    assert claim.confidence.level == "high"
    assert claim.confidence.reason == "supported by 2 independent sources: s2, s1"
    first = claim.citations[0]
    assert (first.passage, first.location.line_start, first.location.line_end) == ("s2:L3-3", 3, 3)
    assert claim.citations[1].quote.startswith("Resume skips completed steps")
    for claim in claims:
        assert claim.citations[0].quote == claim.text


def test_a_claim_said_otherwise_elsewhere_is_contradicted(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME, "not.md": RESUME_NOT})
    cache = InMemorySourceCache()
    sources = _read(root, cache)
    questions = sub_questions("Which steps does resume skip?")
    claims = cross_check(
        extract_claims(questions, recall(questions, sources, cache)), sources, cache
    )
    said = "Resume skips completed steps and re-runs an in-flight step only when it is idempotent."
    claim = next(c for c in claims if c.text == said)
    assert claim.cross_check == "contradicted"
    assert claim.confidence.level == "low"
    assert [c.source for c in claim.contradicted_by] == ["s2"]


def test_a_report_sentence_its_citation_does_not_say_is_refused(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME, "b.md": RESUME_TOO})
    cache = InMemorySourceCache()
    sources = _read(root, cache)
    questions = sub_questions("How does a plan resume after a crash?")
    claims = cross_check(
        extract_claims(questions, recall(questions, sources, cache)), sources, cache
    )
    report = write_report("How does a plan resume after a crash?", questions, sources, claims)
    check_report(report.markdown, sources, cache)  # the written report holds
    assert "when it is idempotent. [s2:L3-3] [s1:L5-5]" in report.markdown
    wrong = report.markdown.replace("when it is idempotent. [s2", "always. [s2", 1)
    with pytest.raises(CitationError, match=r"\[s2:L3-3\] does not say: After a crash"):
        check_report(wrong, sources, cache)
    uncited = report.markdown.replace(" [s2:L3-3] [s1:L5-5]", "", 1)
    with pytest.raises(CitationError, match="cites nothing: After a crash"):
        check_report(uncited, sources, cache)
    moved = report.markdown.replace("[s2:L3-3] [s1:L5-5]", "[s1:L3-3]", 1)
    with pytest.raises(CitationError, match=r"\[s1:L3-3\] does not say: After a crash"):
        check_report(moved, sources, cache)
    support = report.markdown.replace("[s2:L3-3] [s1:L5-5]", "[s2:L3-3] [s1:L3-3]", 1)
    with pytest.raises(CitationError, match=r"\[s1:L3-3\] does not say: After a crash"):
        check_report(support, sources, cache)


def _run(plan: research.Report | object, registry: ToolRegistry) -> dict[str, object]:
    async def go() -> dict[str, object]:
        result = await Engine(tools=registry, agent="perception", store=InMemoryStateStore()).run(
            plan  # type: ignore[arg-type]
        )
        assert result.status == "succeeded", result.failures
        return result.outputs["report"]

    return asyncio.run(go())


def test_the_research_plan_reports_what_could_not_be_read(tmp_path: Path) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME, "b.md": RESUME_TOO, "logo.txt": b"\x00\x01binary"})
    scopes = FileScopes.of([root])
    cache = InMemorySourceCache()
    registry = ToolRegistry("perception")
    for item in research_tools(cache, FetchLedger(None), scopes):
        registry.register(item)
    files = expand_sources([str(root)], scopes, base=root)
    plan = research_plan("How does a plan resume after a crash?", files, plan_id="r-1")
    validate_plan(plan, tools=registry.names())
    report = research.Report.model_validate(_run(plan, registry))
    assert [s.status for s in report.sources] == ["read", "read", "unreadable"]
    assert "## Could not be read" in report.markdown
    assert "logo.txt: a binary file (it holds NUL bytes), not text" in report.markdown
    assert report.answered == ["q1"]
    assert cache.get(report.digest) == report.markdown.encode()
    ids = [c.id for c in report.claims]
    assert len(ids) == len(set(ids)) > 0


def test_sub_questions_split_a_question_that_asks_two_things() -> None:
    found = sub_questions("How does a plan resume after a crash, and what is re-run?")
    assert [q.text for q in found] == [
        "How does a plan resume after a crash, and what is re-run?",
        "How does a plan resume after a crash?",
        "what is re-run?",
    ]
    assert all(q.acceptance for q in found)


def test_confidence_moves_with_the_evidence_and_the_cheap_likely_test_comes_first() -> None:
    tracker = HypothesisTracker()
    tracker.add(Hypothesis(id="H1", statement="the cache is stale", rationale="r", prior=0.5,
                           test_cost=10))  # fmt: skip
    tracker.add(Hypothesis(id="H2", statement="the clock skews", rationale="r", prior=0.2,
                           test_cost=1))  # fmt: skip
    assert [s.hypothesis.id for s in tracker.ranked()] == ["H2", "H1"]
    after = tracker.record(
        Evidence(hypothesis="H1", direction="for", strength=4, note="hit ratio 0", step="p:t1")
    )
    assert after == pytest.approx(0.8)
    after = tracker.record(
        Evidence(hypothesis="H1", direction="against", strength=2, note="fresh", step="p:t2")
    )
    assert after == pytest.approx(2 / 3, abs=1e-6)
    assert len(tracker.state("H1").evidence) == 2
    kept = HypothesisTracker.model_validate_json(tracker.model_dump_json())
    assert kept.state("H1").confidence == tracker.state("H1").confidence


def test_bad_hypotheses_evidence_and_decisions_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="prior"):
        Hypothesis(id="H1", statement="s", rationale="r", prior=1.0, test_cost=1)
    with pytest.raises(ValidationError, match="links to a step, an artifact or a claim"):
        Evidence(hypothesis="H1", direction="for", note="seen")
    tracker = HypothesisTracker(
        hypotheses=[Hypothesis(id="H1", statement="s", rationale="r", prior=0.5, test_cost=1)]
    )
    with pytest.raises(ValueError, match=r"evidence\.hypothesis: no hypothesis H9"):
        tracker.record(Evidence(hypothesis="H9", direction="for", note="n", step="p:s"))
    row = DecisionRow(hypothesis="H1", test_step="t1", outcome="pass", when="t1.passed",
                      next_step="fix-1")  # fmt: skip
    tracker.decide(row)
    with pytest.raises(ValidationError, match=r"decisions\[1\]\.when"):
        tracker.decide(row.model_copy(update={"when": "t1.passed ==="}))
    with pytest.raises(ValidationError, match="duplicate id H1"):
        HypothesisTracker.model_validate(
            {"hypotheses": [tracker.hypotheses[0], tracker.hypotheses[0]]}
        )


def _research_with_kb(root: Path, kb: KnowledgeBase, plan_id: str, question: str) -> Report:
    scopes = FileScopes.of([root])
    registry = ToolRegistry("perception")
    for item in research_tools(InMemorySourceCache(), FetchLedger(None), scopes, kb):
        registry.register(item)
    files = expand_sources([str(root)], scopes, base=root)
    return Report.model_validate(_run(research_plan(question, files, plan_id=plan_id), registry))


def test_the_knowledge_base_keeps_claims_once_and_a_later_goal_reuses_them(
    tmp_path: Path,
) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME, "b.md": RESUME_TOO})
    kb = KnowledgeBase(InMemoryMemoryStore())
    first = _research_with_kb(root, kb, "r-1", "How does a plan resume after a crash?")
    again = _research_with_kb(root, kb, "r-2", "How does a plan resume after a crash?")
    entries = asyncio.run(kb.entries())
    assert sorted(e.id for e in entries) == sorted(c.id for c in first.claims)  # no duplicate
    assert all(e.plans == ["r-1", "r-2"] for e in entries)
    assert again.known == []  # the same claims: found again, not "already known"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c.md").write_text("# Other\n\nNothing here speaks of that.\n")
    later = _research_with_kb(elsewhere, kb, "r-3", "How does a plan resume after a crash?")
    assert later.claims == []
    assert sorted(later.known) == sorted(c.id for c in first.claims)
    assert "## Already known" in later.markdown
    entry = asyncio.run(kb.get(first.claims[0].id))
    assert entry is not None
    cited = first.claims[0].citations[0]
    assert entry.citations[0].locator == str(root / ("a.md" if cited.source == "s1" else "b.md"))
    assert entry.citations[0].location == cited.location.label()


def test_contradicting_claims_are_flagged_and_a_changed_source_makes_its_claims_stale(
    tmp_path: Path,
) -> None:
    root = _corpus(tmp_path, {"a.md": RESUME})
    kb = KnowledgeBase(InMemoryMemoryStore())
    first = _research_with_kb(root, kb, "r-1", "Which steps does resume skip?")
    other = tmp_path / "other"
    other.mkdir()
    (other / "not.md").write_text(RESUME_NOT)
    _research_with_kb(other, kb, "r-2", "Which steps does resume skip?")
    said = "Resume skips completed steps and re-runs an in-flight step only when it is idempotent."
    claim = next(c for c in first.claims if c.text == said)
    entry = asyncio.run(kb.get(claim.id))
    assert entry is not None
    assert entry.contradicts
    contrary = asyncio.run(kb.get(entry.contradicts[0]))
    assert contrary is not None
    assert claim.id in contrary.contradicts
    assert contrary.claim.startswith("Resume never skips")

    def digest_of(locator: str) -> str | None:
        path = Path(locator)
        if not path.exists():
            return None
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()

    (root / "a.md").write_text(RESUME + "\nA line added later.\n")
    (other / "not.md").unlink()
    marked = {e.id: e for e in with_staleness(asyncio.run(kb.entries()), digest_of)}
    assert marked[claim.id].stale
    assert marked[claim.id].stale_reason == f"{root / 'a.md'} changed since it was read"
    assert marked[contrary.id].stale_reason == f"{other / 'not.md'} can no longer be read"
    text = kb_export(list(marked.values()), "md")
    assert f"## {claim.id} (stale, contradicted)" in text
    assert yaml.safe_load(kb_export(list(marked.values()), "yaml"))[0]["id"]


def test_sources_cached_in_the_artifact_store_are_read_back_by_digest(tmp_path: Path) -> None:
    from stratagem.agents.research import ArtifactSourceCache
    from stratagem.planning import ArtifactStore

    root = _corpus(tmp_path, {"a.md": RESUME, "b.md": RESUME_TOO})
    store = ArtifactStore.in_memory()
    cache = ArtifactSourceCache(store)
    sources = _read(root, cache)  # type: ignore[arg-type]
    questions = sub_questions("How does a plan resume after a crash?")
    claims = extract_claims(questions, recall(questions, sources, cache))
    report = write_report("q", questions, sources, cross_check(claims, sources, cache))
    check_report(report.markdown, sources, cache)
    record, data = store.load_blocking("research-a.md")
    assert "sha256:" + record.digest == sources[0].digest
    assert data == RESUME.encode()
    assert record.provenance.tool == "research_collect"
    with pytest.raises(KeyError):
        cache.get("sha256:" + "0" * 64)
