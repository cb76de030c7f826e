"""The console's research pages in a real browser (see ``conftest``): the knowledge base, a claim
with the passage it cites (the cited lines marked in the file), and an investigation with its
ranked hypotheses and decision table (docs/research.md, docs/console.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import ToolRegistry
from stratagem.agents.research import (
    DebugContext,
    DecisionRow,
    Evidence,
    FetchLedger,
    FileScopes,
    Hypothesis,
    HypothesisTracker,
    InMemorySourceCache,
    Investigation,
    Investigations,
    KnowledgeBase,
    Report,
    research_plan,
    research_tools,
)
from stratagem.planning import Engine
from stratagem.runtime.config._memory import open_memory_store
from tests.integration.console.conftest import Running

pytestmark = pytest.mark.timeout(180)

DOCS = Path(__file__).resolve().parents[3] / "docs"


async def _seed(running: Running) -> Report:
    """A research goal's claims over docs/durability.md kept in the deployment's knowledge base,
    and an investigation, as the agents' tools keep them."""
    settings = running.served.settings
    roots = FileScopes.of(settings.research_roots)
    registry = ToolRegistry("perception")
    store = await open_memory_store(settings)
    try:
        for item in research_tools(InMemorySourceCache(), FetchLedger(None), roots):
            registry.register(item)
        plan = research_plan(
            "How does a plan resume after a crash?",
            [str(DOCS / "durability.md")],
            plan_id="research-console",
        )
        result = await Engine(tools=registry, agent="perception").run(plan)
        report = Report.model_validate(result.outputs["report"])
        await KnowledgeBase(store).keep(report, "research-console")
        tracker = HypothesisTracker(
            hypotheses=[
                Hypothesis(
                    id="H1", statement="the note is binary", rationale="r", prior=0.5, test_cost=1
                ),
                Hypothesis(
                    id="H2",
                    statement="the note is outside the scopes",
                    rationale="r",
                    prior=0.3,
                    test_cost=1,
                ),
            ],
            evidence=[
                Evidence(
                    hypothesis="H1",
                    direction="for",
                    strength=9,
                    note="NUL byte",
                    step="debug:test_h1",
                )
            ],
            decisions=[
                DecisionRow(
                    hypothesis="H1",
                    test_step="test_h1",
                    outcome="pass",
                    when="test_h1.holds",
                    next_step="fix_text",
                )
            ],
        )
        await Investigations(store).put(
            Investigation(
                id="console-inv",
                context=DebugContext(symptom="a note cannot be read"),
                tracker=tracker,
                root_cause="H1, a NUL byte",
            )
        )
    finally:
        await store.aclose()
    return report


def test_a_claim_links_to_the_lines_it_cites_and_an_investigation_shows_its_table(
    running: Running, page: Any, artifacts: Path
) -> None:
    report = running.run(_seed(running))
    assert report.claims
    claim = report.claims[0]
    page.goto(running.login_url())
    page.wait_for_url(re.compile(r".*/plans$"))
    page.click("nav a[href='/knowledge']")
    page.wait_for_selector("table.knowledge")
    assert page.locator("table.knowledge tr[data-claim]").count() == len(report.claims)
    page.screenshot(path=str(artifacts / "knowledge.png"), full_page=True)

    page.click(f"tr[data-claim='{claim.id}'] a")
    page.wait_for_selector("#claim-text")
    assert page.inner_text("#claim-text") == claim.text
    first = claim.citations[0].location
    cited = page.locator("section.passage[data-citation='0'] .line.cited")
    numbers = [int(n) for n in cited.evaluate_all("els => els.map(e => e.dataset.line)")]
    assert numbers == list(range(first.line_start, first.line_end + 1))
    lines = (DOCS / "durability.md").read_text(encoding="utf-8").splitlines()
    said = " ".join(lines[first.line_start - 1 : first.line_end])
    assert " ".join(claim.text.split())[:40] in " ".join(said.split())
    page.screenshot(path=str(artifacts / "claim.png"), full_page=True)

    page.goto(f"{running.url}/knowledge?q=crash")
    assert page.locator("table.knowledge tr[data-claim]").count() >= 1
    page.goto(f"{running.url}/knowledge/c-000000000000")
    assert "no claim c-000000000000" in page.inner_text("main")

    page.click("nav a[href='/hypotheses']")
    page.wait_for_selector("table.hypotheses")
    page.click("tr[data-investigation='console-inv'] a")
    page.wait_for_selector("table.ranked")
    assert page.inner_text("#root-cause") == "H1, a NUL byte"
    assert page.inner_text("tr[data-hypothesis='H1'] td.confidence") == "0.90"
    rows = page.locator("table.ranked tr[data-hypothesis]")
    assert rows.evaluate_all("els => els.map(e => e.dataset.hypothesis)") == ["H1", "H2"]
    assert "test_h1.holds" in page.inner_text("table.decisions")
    page.screenshot(path=str(artifacts / "investigation.png"), full_page=True)
    # The JSON twins, with the session the browser holds.
    listed = page.request.get(f"{running.url}/api/knowledge").json()
    assert sorted(e["id"] for e in listed) == sorted(c.id for c in report.claims)
    shown = page.request.get(f"{running.url}/api/knowledge/{claim.id}").json()
    assert [line[0] for line in shown["passages"][0]["lines"] if line[2]] == numbers
    inv = page.request.get(f"{running.url}/api/hypotheses/console-inv").json()
    assert [s["hypothesis"]["id"] for s in inv["ranked"]] == ["H1", "H2"]
    assert page.request.get(f"{running.url}/api/hypotheses/nope").status == 404
    assert page.errors == []
