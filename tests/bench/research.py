"""The research path over docs/: citation precision and recall, time per question.

Each question of ``tests/bench/research.yaml`` is researched over the repository's ``docs/`` as a
plan (the research tools, in-process, the engine with an in-memory store: no Ray, no model).
Precision: of every citation of every claim, the share whose cited lines, read again from the file,
say the claim (the first citation word for word, a supporting one a sentence of half its words or
more; ``check_report``'s rule). Recall: of the passages marked as answering, the share that some
claim of the question's report cites (its cited lines overlap the marked passage's).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from stratagem.agents import ToolRegistry
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    Report,
    expand_sources,
    passages_of,
    research_plan,
    research_tools,
)
from stratagem.agents.research._findings import SUPPORT_OVERLAP
from stratagem.agents.research._text import contains, overlap, sentences, terms
from stratagem.planning import Engine

REPO = Path(__file__).resolve().parents[2]
SUITE = Path(__file__).with_name("research.yaml")
TARGET_PRECISION = 0.95


def _lines(path: str, start: int, end: int) -> str:
    return "\n".join(Path(path).read_text(encoding="utf-8").splitlines()[start - 1 : end])


def _says(text: str, claim: str, first: bool) -> bool:
    if first:
        return contains(text, claim)
    mine = terms(claim)
    return any(overlap(mine, terms(s)) >= SUPPORT_OVERLAP for s in sentences(text))


async def _research(question: str, files: list[str]) -> tuple[Report, InMemorySourceCache]:
    cache = InMemorySourceCache()
    registry = ToolRegistry("perception")
    for item in research_tools(cache, FetchLedger(None), FileScopes.of([REPO])):
        registry.register(item)
    result = await Engine(tools=registry, agent="perception").run(
        research_plan(question, files, plan_id="bench-research")
    )
    result.raise_for_status()
    return Report.model_validate(result.outputs["report"]), cache


def _marked(answer: dict[str, str], report: Report, cache: InMemorySourceCache) -> tuple[int, int]:
    """The marked passage's line range, found by its phrase in the report's copy of the file."""
    path = str((REPO / answer["file"]).resolve())
    source = next(s for s in report.sources if s.locator == path)
    for passage in passages_of(source, cache):
        if answer["holds"] in passage.text:
            return passage.location.line_start, passage.location.line_end
    raise ValueError(f"{answer['file']}: no passage holds {answer['holds']!r} (fix the suite)")


def run_research_benchmark() -> dict[str, Any]:
    """Run the suite; the figures for BENCHMARKS.md."""
    suite = yaml.safe_load(SUITE.read_text(encoding="utf-8"))
    files = expand_sources(["docs/"], FileScopes.of([REPO]), base=REPO)
    rows: list[dict[str, Any]] = []
    cited_ok = cited_all = found = marked = 0
    for entry in suite:
        started = time.perf_counter()
        report, cache = asyncio.run(_research(entry["question"], files))
        seconds = time.perf_counter() - started
        by_id = {s.id: s for s in report.sources}
        good = total = 0
        spans: list[tuple[str, int, int]] = []
        for claim in report.claims:
            for n, citation in enumerate(claim.citations):
                path = by_id[citation.source].locator
                start, end = citation.location.line_start, citation.location.line_end
                total += 1
                good += _says(_lines(path, start, end), claim.text, first=n == 0)
                spans.append((path, start, end))
        hits = 0
        for answer in entry["answers"]:
            low, high = _marked(answer, report, cache)
            path = str((REPO / answer["file"]).resolve())
            hits += any(p == path and s <= high and low <= e for p, s, e in spans)
        cited_ok, cited_all = cited_ok + good, cited_all + total
        found, marked = found + hits, marked + len(entry["answers"])
        rows.append(
            {
                "question": entry["question"],
                "claims": len(report.claims),
                "citations": total,
                "precise": good,
                "answers_marked": len(entry["answers"]),
                "answers_cited": hits,
                "seconds": round(seconds, 3),
            }
        )
    times = [row["seconds"] for row in rows]
    precision = cited_ok / cited_all if cited_all else 0.0
    return {
        "corpus": {"folder": "docs/", "files": len(files)},
        "questions": rows,
        "precision": round(precision, 4),
        "recall": round(found / marked, 4) if marked else 0.0,
        "citations": cited_all,
        "seconds_per_question": {
            "median": round(statistics.median(times), 3),
            "max": round(max(times), 3),
        },
        "target_precision": TARGET_PRECISION,
        "met": precision >= TARGET_PRECISION,
        "model": {"skipped": "not measured (ModelResearcher is tested with a scripted model only)"},
    }


def research_section(research: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's research section."""
    lines = ["## Research: citation precision and recall over docs/", ""]
    if not research:
        return [*lines, "Not measured in this run.", ""]
    if "skipped" in research:
        return [*lines, f"Skipped: {research['skipped']}.", ""]
    lines += [
        f"How it was measured (`tests/bench/research.py`, suite `tests/bench/research.yaml`): "
        f"each question researched as a plan over the {research['corpus']['files']} files of "
        "`docs/` (the research tools in-process, no Ray, no model). Precision: the share of "
        "citations whose cited lines, read again from the file, say the claim. Recall: the share "
        "of the passages a person marked as answering that some claim cites. Target: precision "
        f"at least {research['target_precision']:.0%} (a wrong citation is worse than none): "
        f"{'met' if research['met'] else 'NOT met'}.",
        "",
        f"Precision **{research['precision']:.1%}** over {research['citations']} citations; "
        f"recall **{research['recall']:.1%}**; "
        f"{research['seconds_per_question']['median']:.2f} s per question (median; max "
        f"{research['seconds_per_question']['max']:.2f} s). With a model: "
        f"{research['model']['skipped']}.",
        "",
        "| question | claims | citations | precise | answers cited / marked | s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in research["questions"]:
        lines.append(
            f"| {row['question']} | {row['claims']} | {row['citations']} | {row['precise']} | "
            f"{row['answers_cited']} / {row['answers_marked']} | {row['seconds']:.2f} |"
        )
    return [*lines, ""]
