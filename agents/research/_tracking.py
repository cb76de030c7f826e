"""Investigations: a hypothesis tracker kept in the deployment's memory, and the tools plans use.

An investigation is one memory item (namespace ``agent/<role>/hypotheses``, key its id): its
context, its reproduction, its ``HypothesisTracker``, its root cause, fix and postmortem. Any
agent's plans reach it through the ``hypotheses.*`` tools; each tool is idempotent (a resumed plan
runs an interrupted step again without a second piece of evidence: evidence is keyed by the step
that observed it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stratagem.agents._tool import Tool, tool
from stratagem.agents.research._hypotheses import HypothesisState, HypothesisTracker
from stratagem.agents.research._kb import Items
from stratagem.agents.research._sources import SourceCache
from stratagem.agents.research._types import DecisionRow, Evidence, Hypothesis
from stratagem.planning import LogicError, ToolContext

__all__ = [
    "HYPOTHESIS_TOOLS",
    "DebugContext",
    "Investigation",
    "Investigations",
    "hypothesis_tools",
    "postmortem_markdown",
]

HYPOTHESES = "hypotheses"
"""The last part of an investigation's namespace: ``agent/<role>/hypotheses``, the memory of the
agent whose plan opened it."""
HYPOTHESIS_TOOLS = ("hypotheses.open", "hypotheses.add", "hypotheses.test", "hypotheses.postmortem")
"""The tools plans use to track an investigation, in the order a debug plan calls them."""
HOLDS = 0.75
"""The confidence from which a test's outcome says the hypothesis holds."""

_INVESTIGATION = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class DebugContext(BaseModel):
    """What is known of a failure before it is investigated (the seed's debug template)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    symptom: str = Field(min_length=1, max_length=2000)
    impact: str = Field(default="", max_length=2000)
    frequency: str = Field(default="", max_length=500)
    first_seen: str = Field(default="", max_length=200)
    last_known_good: str = Field(default="", max_length=200)


class Investigation(BaseModel):
    """One investigation: context, reproduction, hypotheses and evidence, outcome."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=_INVESTIGATION)
    context: DebugContext
    reproduction: str = Field(default="", max_length=4000)
    tracker: HypothesisTracker = Field(default_factory=HypothesisTracker)
    root_cause: str = ""
    fix: str = ""
    postmortem: str = ""
    """The digest of the postmortem artifact (empty until written)."""


class Investigations:
    """The investigations kept in a memory under ``agent/<role>/hypotheses`` (one writer at a
    time in this process)."""

    def __init__(self, store: Items, *, role: str = "perception") -> None:
        self.store = store
        self.namespace = ("agent", role, HYPOTHESES)
        self._lock = asyncio.Lock()

    async def get(self, investigation_id: str) -> Investigation | None:
        """One investigation, or ``None``."""
        item = await self.store.get(self.namespace, investigation_id)
        return None if item is None else Investigation.model_validate(item.value)

    async def all(self, *, limit: int = 1000) -> list[Investigation]:
        """Every investigation, by id."""
        items = await self.store.list(self.namespace, limit=limit)
        return [Investigation.model_validate(item.value) for item in items]

    async def put(self, investigation: Investigation) -> None:
        """Keep an investigation as it is."""
        value: Any = investigation.model_dump(mode="json")
        await self.store.put(self.namespace, investigation.id, value)

    async def _known(self, investigation_id: str) -> Investigation:
        found = await self.get(investigation_id)
        if found is None:
            raise LogicError(
                f"investigation: no investigation {investigation_id!r} (open it first)"
            )
        return found


class _Opened(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    investigation: str


class _Ranked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ranked: list[HypothesisState]


class _Tested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    hypothesis: str
    confidence: float
    holds: bool


class _Postmortem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    digest: str
    markdown: str


def postmortem_markdown(investigation: Investigation) -> str:
    """The postmortem: context, reproduction, hypotheses with their evidence, decision table,
    root cause and fix."""
    ctx = investigation.context
    lines = [f"# Postmortem: {investigation.id}", "", "## Context", ""]
    for label, value in (("Symptom", ctx.symptom), ("Impact", ctx.impact),
                         ("Frequency", ctx.frequency), ("First seen", ctx.first_seen),
                         ("Last known good", ctx.last_known_good)):  # fmt: skip
        if value:
            lines.append(f"- {label}: {value}")
    lines += ["", "## Reproduction", "", investigation.reproduction or "(none recorded)", ""]
    lines += ["## Hypotheses", "", "| id | statement | prior | confidence | test cost |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    tracker = investigation.tracker
    for state in tracker.ranked():
        h = state.hypothesis
        lines.append(
            f"| {h.id} | {h.statement} | {h.prior:.2f} | {state.confidence:.2f} | {h.test_cost:g} |"
        )
    lines += ["", "## Evidence", ""]
    for item in tracker.evidence:
        lines.append(
            f"- {item.hypothesis} {item.direction} (x{item.strength:g}): {item.note}"
            f" [{item.step or item.artifact or item.claim}]"
        )
    lines += ["", "## Decision table", "", "| hypothesis | test | outcome | when | next |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in tracker.decisions:
        lines.append(
            f"| {row.hypothesis} | {row.test_step} | {row.outcome} | `{row.when}` |"
            f" {row.next_step} |"
        )
    lines += ["", "## Root cause", "", investigation.root_cause or "not found", ""]
    lines += ["## Fix", "", investigation.fix or "none", ""]
    return "\n".join(lines)


def hypothesis_tools(
    store: Items, cache: SourceCache, *, role: str = "perception"
) -> list[Tool[Any, Any]]:
    """The ``hypotheses.*`` tools over the investigations in ``store`` (``role``'s namespace);
    postmortems are cached in ``cache`` (an artifact by digest)."""
    kept = Investigations(store, role=role)

    @tool(name="hypotheses.open", side_effects=True, idempotent=True)
    async def open_(investigation: str, context: DebugContext, reproduction: str = "") -> _Opened:
        """Open an investigation with its context and reproduction (again: nothing changes)."""
        async with kept._lock:
            if await kept.get(investigation) is None:
                try:
                    record = Investigation(
                        id=investigation, context=context, reproduction=reproduction
                    )
                except ValueError as exc:
                    raise LogicError(f"investigation: {exc}") from exc
                await kept.put(record)
        return _Opened(investigation=investigation)

    @tool(name="hypotheses.add", side_effects=True, idempotent=True)
    async def add(
        investigation: str, hypotheses: list[Hypothesis], decisions: list[DecisionRow]
    ) -> _Ranked:
        """Add hypotheses (ids already there are kept) and decision-table rows; the ranking."""
        async with kept._lock:
            record = await kept._known(investigation)
            tracker = record.tracker
            known = {h.id for h in tracker.hypotheses}
            try:
                merged = HypothesisTracker.model_validate(
                    {
                        "hypotheses": [*tracker.hypotheses,
                                       *(h for h in hypotheses if h.id not in known)],
                        "evidence": tracker.evidence,
                        "decisions": [*tracker.decisions,
                                      *(d for d in decisions if d not in tracker.decisions)],
                    }
                )  # fmt: skip
            except ValueError as exc:
                raise LogicError(f"hypotheses: {exc}") from exc
            await kept.put(record.model_copy(update={"tracker": merged}))
        return _Ranked(ranked=merged.ranked())

    @tool(name="hypotheses.test", side_effects=True, idempotent=True)
    async def test(
        investigation: str,
        hypothesis: str,
        observed: bool,
        note: str,
        ctx: ToolContext,
        strength: float = 3.0,
    ) -> _Tested:
        """Record a test's outcome as evidence for (observed) or against the hypothesis, linked to
        this step; its confidence now, and whether it holds."""
        step = f"{ctx.plan_id}:{ctx.step_id}"
        async with kept._lock:
            record = await kept._known(investigation)
            tracker = record.tracker
            if not any(e.step == step and e.hypothesis == hypothesis for e in tracker.evidence):
                try:
                    evidence = Evidence(
                        hypothesis=hypothesis,
                        direction="for" if observed else "against",
                        strength=strength,
                        note=note,
                        step=step,
                    )
                    tracker.record(evidence)
                except ValueError as exc:
                    raise LogicError(f"evidence: {exc}") from exc
                await kept.put(record)
            confidence = tracker.state(hypothesis).confidence
        return _Tested(hypothesis=hypothesis, confidence=confidence, holds=confidence >= HOLDS)

    @tool(name="hypotheses.postmortem", side_effects=True, idempotent=True)
    async def postmortem(investigation: str, root_cause: str, fix: str) -> _Postmortem:
        """Close the investigation with its root cause and fix; write the postmortem artifact."""
        async with kept._lock:
            record = await kept._known(investigation)
            record = record.model_copy(update={"root_cause": root_cause, "fix": fix})
            markdown = postmortem_markdown(record)
            digest = cache.put(
                markdown.encode(),
                name=f"postmortem-{investigation}.md",
                media_type="text/markdown",
                tool="hypotheses.postmortem",
            )
            await kept.put(record.model_copy(update={"postmortem": digest}))
        return _Postmortem(digest=digest, markdown=markdown)

    return [open_, add, test, postmortem]
