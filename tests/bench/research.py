"""The research path over docs/: citation precision and recall, time per question.

Each question of ``tests/bench/research.yaml`` is researched over the repository's ``docs/`` as a
plan (the research tools, in-process, the engine with an in-memory store: no Ray, no model).
Precision: of every citation of every claim, the share whose cited lines, read again from the file,
say the claim (the first citation word for word, a supporting one a sentence of half its words or
more; ``check_report``'s rule). Recall: of the passages marked as answering, the share that some
claim of the question's report cites (its cited lines overlap the marked passage's).

With the embedded model (``tests/bench/quality.py``'s server, or ``STRATAGEM_BENCH_MODEL_URL``)
the same questions are researched again with a ``ModelResearcher``: the model writes the
sub-questions and a synthesis; the claims stay extractive and are measured as above, and each
synthesis sentence kept in the report is measured the same way (its every cited passage must hold a
sentence of half its words or more). ``STRATAGEM_BENCH_RESEARCH_MODEL_QUESTIONS`` (default
``MODEL_QUESTIONS``) says how many questions run with the model: it is slow on a CPU.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stratagem.agents import ModelConfig, OpenAIModelClient, ToolRegistry
from stratagem.agents.research import (
    FetchLedger,
    FileScopes,
    InMemorySourceCache,
    ModelResearcher,
    Report,
    expand_sources,
    passages_of,
    research_plan,
    research_tools,
)
from stratagem.agents.research._findings import SUPPORT_OVERLAP
from stratagem.agents.research._text import contains, overlap, sentences, terms
from stratagem.planning import Engine, EngineConfig, PlanFailedError
from tests.bench.quality import _MODEL_SH, _start_model_server

REPO = Path(__file__).resolve().parents[2]
SUITE = Path(__file__).with_name("research.yaml")
TARGET_PRECISION = 0.95
MODEL_QUESTIONS = 2
"""How many questions of the suite run with the embedded model by default (each asks it twice or
three times: sub-questions, a synthesis, perhaps a critique round)."""
MODEL_STEP_TIMEOUT_S = 900.0
"""The limit on one attempt of a step with the model (the engine's default is 30 s)."""
_SYNTHESIS_LINE = re.compile(r"^- (.+?) ((?:\[s\d+:[LP][^\]]*\] ?)+)$")
_CITE = re.compile(r"\[(s\d+):L(\d+)-(\d+)\]")


def _lines(path: str, start: int, end: int) -> str:
    return "\n".join(Path(path).read_text(encoding="utf-8").splitlines()[start - 1 : end])


def _says(text: str, claim: str, first: bool) -> bool:
    if first:
        return contains(text, claim)
    mine = terms(claim)
    return any(overlap(mine, terms(s)) >= SUPPORT_OVERLAP for s in sentences(text))


Researcher = Callable[[], ModelResearcher]
"""Makes the model researcher, on the event loop of the question that uses it."""


def _researcher(server: dict[str, str]) -> ModelResearcher:
    """The embedded model as a researcher."""
    return ModelResearcher(
        OpenAIModelClient(
            ModelConfig(
                url=server["url"],
                model=server["model"],
                schema_style="json_object",
                timeout_s=300,
                max_concurrent=1,
            )
        )
    )


async def _research(
    question: str, files: list[str], researcher: Researcher | None = None
) -> tuple[Report, InMemorySourceCache]:
    model = researcher() if researcher is not None else None
    cache = InMemorySourceCache()
    registry = ToolRegistry("perception")
    for item in research_tools(cache, FetchLedger(None), FileScopes.of([REPO]), model=model):
        registry.register(item)
    # A model step on a CPU outlasts the engine's default 30 s limit on one attempt.
    config = EngineConfig(default_timeout_s=MODEL_STEP_TIMEOUT_S if model else 30.0)
    result = await Engine(config, tools=registry, agent="perception").run(
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


def _synthesis(report: Report) -> tuple[int, int, int]:
    """The report's synthesis sentences: (sentences, citations, citations whose lines say it)."""
    _, found, rest = report.markdown.partition("\n## Synthesis\n")
    if not found:
        return 0, 0, 0
    by_id = {s.id: s for s in report.sources}
    count = total = good = 0
    for line in rest.partition("\n## ")[0].splitlines():
        match = _SYNTHESIS_LINE.match(line.strip())
        if match is None:
            continue
        count += 1
        for source, start, end in _CITE.findall(match.group(2)):
            total += 1
            text = _lines(by_id[source].locator, int(start), int(end))
            good += _says(text, match.group(1), first=False)
    return count, total, good


def _measure(
    entry: dict[str, Any], files: list[str], researcher: Researcher | None = None
) -> dict[str, Any]:
    """One question researched (with a model when ``researcher`` is given): its row (claims,
    citations, answers cited, time)."""
    started = time.perf_counter()
    report, cache = asyncio.run(_research(entry["question"], files, researcher))
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
    row: dict[str, Any] = {
        "question": entry["question"],
        "claims": len(report.claims),
        "citations": total,
        "precise": good,
        "answers_marked": len(entry["answers"]),
        "answers_cited": hits,
        "seconds": round(seconds, 3),
    }
    if researcher is not None:
        sentences_, cited, said = _synthesis(report)
        row |= {
            "sub_questions": len(report.sub_questions),
            "synthesis_sentences": sentences_,
            "synthesis_citations": cited,
            "synthesis_precise": said,
            "synthesis_refused": len(report.refused),
            "refusals": [line[:160] for line in report.refused],
        }
    return row


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cited_all = sum(row["citations"] for row in rows)
    precision = sum(row["precise"] for row in rows) / cited_all if cited_all else 0.0
    marked = sum(row["answers_marked"] for row in rows)
    times = [row["seconds"] for row in rows]
    return {
        "questions": rows,
        "precision": round(precision, 4),
        "recall": round(sum(row["answers_cited"] for row in rows) / marked, 4) if marked else 0.0,
        "citations": cited_all,
        "seconds_per_question": {
            "median": round(statistics.median(times), 3),
            "max": round(max(times), 3),
        },
    }


def run_research_benchmark(*, model_questions: int | None = None) -> dict[str, Any]:
    """Run the suite, then ``model_questions`` of it with the embedded model (``None``:
    ``STRATAGEM_BENCH_RESEARCH_MODEL_QUESTIONS``, else ``MODEL_QUESTIONS``); the figures for
    BENCHMARKS.md."""
    suite = yaml.safe_load(SUITE.read_text(encoding="utf-8"))
    files = expand_sources(["docs/"], FileScopes.of([REPO]), base=REPO)
    totals = _totals([_measure(entry, files) for entry in suite])
    return {
        "corpus": {"folder": "docs/", "files": len(files)},
        **totals,
        "target_precision": TARGET_PRECISION,
        "met": totals["precision"] >= TARGET_PRECISION,
        "model": run_research_model_benchmark(suite, files, model_questions),
    }


def run_research_model_benchmark(
    suite: list[dict[str, Any]],
    files: list[str],
    count: int | None = None,
    researcher: Researcher | None = None,
) -> dict[str, Any]:
    """The first ``count`` questions (``STRATAGEM_BENCH_RESEARCH_MODEL_QUESTIONS``, else
    ``MODEL_QUESTIONS``) researched with the embedded model (or ``researcher``'s, when given:
    tests); ``{"skipped": why}`` when none."""
    if count is None:
        count = int(
            os.environ.get("STRATAGEM_BENCH_RESEARCH_MODEL_QUESTIONS", str(MODEL_QUESTIONS))
        )
    if count <= 0:
        return {"skipped": "no question was asked to run with the model"}
    if researcher is not None:
        return _model_rows(researcher().client.model, suite, count, files, researcher)
    server, env, skipped = _start_model_server()
    if server is None:
        return {"skipped": skipped}
    try:
        return _model_rows(server["model"], suite, count, files, lambda: _researcher(server))
    finally:
        if env:
            subprocess.run(
                ["bash", str(_MODEL_SH), "stop"], capture_output=True, timeout=120, env=env
            )


def _model_rows(
    name: str,
    suite: list[dict[str, Any]],
    count: int,
    files: list[str],
    researcher: Researcher,
) -> dict[str, Any]:
    """The first ``count`` questions with the model; a question whose plan failed is listed
    with its failure, the figures are over those that finished."""
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for entry in suite[:count]:
        try:
            rows.append(_measure(entry, files, researcher))
        except PlanFailedError as exc:
            failed.append({"question": entry["question"], "failure": str(exc)[:300]})
    if not rows:
        return {"skipped": f"every question failed with the model: {failed[0]['failure']}"}
    return {**_model_totals(name, len(suite), rows), "failed": failed}


def _model_totals(name: str, of: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals = _totals(rows)
    said = sum(row["synthesis_citations"] for row in rows)
    return {
        "model": name,
        "of": of,
        **totals,
        "synthesis": {
            "sentences": sum(row["synthesis_sentences"] for row in rows),
            "citations": said,
            "precision": round(sum(row["synthesis_precise"] for row in rows) / said, 4)
            if said
            else None,
            "refused": sum(row["synthesis_refused"] for row in rows),
        },
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
        f"{research['seconds_per_question']['max']:.2f} s).",
        "",
        "| question | claims | citations | precise | answers cited / marked | s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in research["questions"]:
        lines.append(
            f"| {row['question']} | {row['claims']} | {row['citations']} | {row['precise']} | "
            f"{row['answers_cited']} / {row['answers_marked']} | {row['seconds']:.2f} |"
        )
    return [*lines, "", *_model_lines(research.get("model") or {})]


def _model_lines(model: dict[str, Any]) -> list[str]:
    """The research section's part for the embedded model."""
    lines = ["### With the embedded model", ""]
    if "skipped" in model or not model:
        return [*lines, f"Not measured: {model.get('skipped', 'not run')}.", ""]
    synthesis = model["synthesis"]
    said = (
        f"{synthesis['precision']:.1%} of their {synthesis['citations']} citations say them"
        if synthesis["precision"] is not None
        else "none cited"
    )
    lines += [
        f"The first {len(model['questions']) + len(model.get('failed', []))} of the "
        f"{model['of']} questions (a subset: the model "
        f"runs on this machine's CPU), researched again with `{model['model']}` writing the "
        "sub-questions and a synthesis (`ModelResearcher`, the embedded server of "
        "`scripts/model_server.sh`). The claims stay extractive: precision "
        f"**{model['precision']:.1%}** over {model['citations']} citations, recall "
        f"**{model['recall']:.1%}**; {model['seconds_per_question']['median']:.1f} s per question "
        f"(median; max {model['seconds_per_question']['max']:.1f} s). Synthesis: "
        f"{synthesis['sentences']} sentences kept ({said}); {synthesis['refused']} refused "
        "(a sentence a cited passage does not say, or an answer that is no synthesis: dropped, "
        "never shown).",
        "",
    ]
    refusals = sorted({line for row in model["questions"] for line in row.get("refusals", [])})
    if refusals:
        lines += ["Refusals: " + "; ".join(f"`{line}`" for line in refusals[:6]) + ".", ""]
    for failure in model.get("failed", []):
        lines += [f"Failed with the model: {failure['question']} ({failure['failure']}).", ""]
    lines += [
        "| question | sub-questions | claims | citations | precise | answers cited / marked "
        "| synthesis kept / refused | s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in model["questions"]:
        lines.append(
            f"| {row['question']} | {row['sub_questions']} | {row['claims']} | "
            f"{row['citations']} | {row['precise']} | {row['answers_cited']} / "
            f"{row['answers_marked']} | {row['synthesis_sentences']} / "
            f"{row['synthesis_refused']} | {row['seconds']:.1f} |"
        )
    return [*lines, ""]
