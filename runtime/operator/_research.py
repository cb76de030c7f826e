"""``Operator.research``: a research goal run as a plan on the perception agent.

The question and the sources are checked here first (the question's length, each source within
the deployment's file scopes), each folder is expanded to its files, and the plan is run like any
other (``run_plan``): visible in ``plans list``, journaled, resumed after a crash. The report is
read back from the plan's ``report`` step. ``Operator.research`` and ``SyncOperator.research`` are
the part ``Research``'s method (one line in the operator's ``Verbs``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from stratagem.runtime.config._errors import InputError
from stratagem.runtime.operator._link import Link
from stratagem.runtime.operator._plans import Plans
from stratagem.runtime.operator._runs import Runs

if TYPE_CHECKING:
    from stratagem.agents.research import Investigation, KbEntry, Report
    from stratagem.runtime.config._settings import Settings

__all__ = [
    "Research",
    "ResearchOutcome",
    "investigations",
    "knowledge",
    "research_plan_for",
]

RESEARCH_OWNER = "perception"


@dataclass(frozen=True, slots=True)
class ResearchOutcome:
    """A research goal's result: its plan and its report."""

    plan_id: str
    report: Report


def research_plan_for(
    question: str,
    sources: Sequence[str],
    scopes: Sequence[Path],
    *,
    base: Path | None = None,
    plan_id: str | None = None,
    model_timeout_s: float = 0.0,
) -> dict[str, object]:
    """The research plan (as JSON data) for ``question`` over ``sources``, checked here; its model
    steps limited to ``model_timeout_s`` when the owner researches with a model.

    Raises:
        InputError: The question is empty or too long, no source is named, a source is outside
            the file scopes or not there, or the sources hold no readable kind of file.
    """
    # The agents are imported here, not with the module (as the operator's plan checks do).
    from stratagem.agents.research import (
        FileScopes,
        Question,
        SourceRefusedError,
        expand_sources,
        research_plan,
    )

    try:
        text = Question(text=question).text
    except ValidationError as exc:
        raise InputError(
            f"question: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
        ) from exc
    if not sources:
        raise InputError("--sources: name at least one file or folder")
    try:
        files = expand_sources(sources, FileScopes.of(scopes), base=base or Path.cwd())
    except SourceRefusedError as exc:
        raise InputError(str(exc)) from exc
    if not files:
        raise InputError(f"--sources: no Markdown, text or PDF file in {', '.join(sources)}")
    plan = research_plan(text, files, plan_id=plan_id or f"research-{uuid.uuid4().hex[:12]}",
                         owner=RESEARCH_OWNER, model_timeout_s=model_timeout_s)  # fmt: skip
    return plan.model_dump(mode="json")


class Research:
    """Research goals over local files and folders, through ``runs`` and ``plans``."""

    def __init__(self, link: Link, runs: Runs, plans: Plans) -> None:
        self._link = link
        self._runs = runs
        self._plans = plans

    async def research(
        self,
        question: str,
        sources: Sequence[str],
        *,
        base: Path | None = None,
        plan_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> ResearchOutcome:
        """Research ``question`` over local files and folders; the plan id and the report.

        Args:
            question: The question (at most ``MAX_QUESTION_CHARS`` characters).
            sources: Files and folders (relative to ``base``, default the current folder), each
                within the deployment's file scopes (``STRATAGEM_RESEARCH_SCOPES``).
            base: What relative sources are relative to.
            plan_id: The plan's id (default ``research-<12 hex>``).
            timeout: The deadline of the run.

        Raises:
            InputError: A bad question or source (one line naming it).
            protocol.RemoteError: The plan failed on the agent.
        """
        settings = self._link.settings
        plan = research_plan_for(
            question,
            sources,
            settings.research_roots,
            base=base,
            plan_id=plan_id,
            model_timeout_s=settings.planning_timeout_s(RESEARCH_OWNER),
        )
        view = await self._runs.run_plan(plan, timeout=timeout)
        from stratagem.agents.research import Report

        history = await self._plans.plan(view.plan_id, full=True)
        for planned in history.plans:
            for step in planned.steps:
                if step.id == "report" and step.output is not None:
                    return ResearchOutcome(view.plan_id, Report.model_validate(step.output))
        raise InputError(f"plan {view.plan_id}: no report was kept ({view.status})")


def _digest_now(locator: str) -> str | None:
    """A local source's digest now (``None``: it cannot be read)."""
    import hashlib

    try:
        return "sha256:" + hashlib.sha256(Path(locator).read_bytes()).hexdigest()
    except OSError:
        return None


async def knowledge(
    settings: Settings, *, query: str = "", claim_id: str = "", limit: int = 1000
) -> list[KbEntry]:
    """The deployment's knowledge base (its memory's ``kb`` namespace), each claim flagged stale
    when a cited file's bytes changed or it is gone: every claim, those matching ``query``, or
    the one ``claim_id`` (none when unknown).

    Raises:
        StorageError: The memory cannot be opened.
    """
    from stratagem.agents.research import KnowledgeBase, with_staleness
    from stratagem.runtime.config._memory import open_memory_store

    store = await open_memory_store(settings)
    try:
        kb = KnowledgeBase(store)
        if claim_id:
            found = await kb.get(claim_id)
            entries = [] if found is None else [found]
        elif query:
            entries = await kb.search(query, limit=min(limit, 1000))
        else:
            entries = await kb.entries(limit=limit)
    finally:
        await store.aclose()
    return with_staleness(entries, _digest_now)


async def investigations(settings: Settings, investigation_id: str = "") -> list[Investigation]:
    """The deployment's investigations (the ``hypotheses.*`` tools keep them in each agent's
    memory, ``agent/<role>/hypotheses``): every one, or the one named (none when unknown).

    Raises:
        StorageError: The memory cannot be opened.
    """
    from stratagem.agents.research import Investigation
    from stratagem.agents.research._tracking import HYPOTHESES
    from stratagem.runtime.config._memory import open_memory_store

    store = await open_memory_store(settings)
    try:
        items = await store.list(("agent",), limit=1000)
    finally:
        await store.aclose()
    found = [
        Investigation.model_validate(item.value)
        for item in items
        if len(item.namespace) == 3 and item.namespace[2] == HYPOTHESES
    ]
    if investigation_id:
        return [i for i in found if i.id == investigation_id][:1]
    return sorted(found, key=lambda i: i.id)
