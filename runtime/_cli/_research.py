"""``research``: a research goal over local files and folders, run as a plan, its report printed;
``kb list|show|search|export``: the knowledge base those goals keep; ``hypotheses list|show``:
the investigations plans track with the ``hypotheses.*`` tools."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stratagem.runtime._cli._app import (
    AddressOpt,
    EmbeddedOpt,
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _errors,
    _load_agents,
    _operate,
    _print_json,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
)
from stratagem.runtime.operator._input import InputError

if TYPE_CHECKING:
    import yaml
    from rich.table import Table

    from stratagem.agents.research import (
        Investigation,
        KbEntry,
        kb_export,
        kb_markdown,
        postmortem_markdown,
    )
    from stratagem.runtime.operator._operator import Operator
    from stratagem.runtime.operator._research import (
        ResearchOutcome,
        investigations,
        knowledge,
        research_plan_for,
    )

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())

MAX_GOAL_FILE_BYTES = 64 * 1024
"""The largest research goal file read."""


def _goal_file(path: Path) -> tuple[str, list[str]]:
    """A goal file's question and sources (YAML or JSON: ``question``, ``sources``)."""
    try:
        if path.stat().st_size > MAX_GOAL_FILE_BYTES:
            raise InputError(f"{path}: larger than {MAX_GOAL_FILE_BYTES} bytes")
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not YAML or JSON ({type(exc).__name__})") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: a mapping with 'question' and 'sources' is expected")
    question, sources = data.get("question"), data.get("sources", [])
    if not isinstance(question, str):
        raise InputError(f"{path}: question: a string is expected")
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise InputError(f"{path}: sources: a list of paths is expected")
    unknown = sorted(set(data) - {"question", "sources"})
    if unknown:
        raise InputError(f"{path}: {unknown[0]}: not a field of a research goal")
    return question, sources


@app.command("research")
def research(
    question: Annotated[
        str | None,
        typer.Argument(help="The question (at most 2000 characters).", show_default=False),
    ] = None,
    sources: Annotated[
        list[str] | None,
        typer.Option(
            "--sources",
            help="A file or folder to read (Markdown, text, PDF); repeat for more. Each must lie "
            "within the file scopes (STRATAGEM_RESEARCH_SCOPES).",
        ),
    ] = None,
    goal_file: Annotated[
        Path | None,
        typer.Option("--goal-file", help="A YAML or JSON file with 'question' and 'sources'."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the Markdown report to this file, not to stdout."),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    embedded: EmbeddedOpt = False,
) -> None:
    """Research a question over local files: a plan on the perception agent reads each source
    once, recalls passages, extracts claims cited at the lines that say them, cross-checks them
    and prints a report whose every finding cites its sources.

    Examples:

      stratagem research "How does a plan resume after a crash?" --sources docs/

      stratagem research --goal-file goal.yaml --json
    """
    with _errors():
        if goal_file is not None:
            if question is not None or sources:
                raise InputError("--goal-file: give the question and sources there, not both")
            question, sources = _goal_file(goal_file)
        if question is None:
            raise InputError("question: missing (or give --goal-file)")
        settings = _settings(address, state_dir)
        asked, named = question, list(sources or [])

        async def run(op: Operator) -> ResearchOutcome:
            return await op.research(asked, named, base=Path.cwd(), timeout=timeout)

        # Checked here first, so bad input is one line before any agent is found or started.
        research_plan_for(asked, named, settings.research_roots, base=Path.cwd())
        outcome = _operate(settings, run, timeout=timeout, embedded=embedded)
        report = outcome.report
        if out is not None:
            out.write_text(report.markdown, encoding="utf-8")
        if as_json:
            _print_json({"plan_id": outcome.plan_id, "report": report.model_dump(mode="json")})
            return
        if out is None:
            console.print(report.markdown, highlight=False, soft_wrap=True, markup=False)
        unread = len(report.unreadable)
        err_console.print(
            f"plan {outcome.plan_id}: {len(report.claims)} claims from "
            f"{len(report.sources) - unread} sources"
            + (f", {unread} could not be read" if unread else "")
            + f"; report {report.digest}"
            + (f" in {out}" if out is not None else ""),
            highlight=False,
            soft_wrap=True,
        )


kb_app = typer.Typer(
    help="The knowledge base: claims research goals found, with citations and confidence.",
    no_args_is_help=True,
)
app.add_typer(kb_app, name="kb")


def _kb(state_dir: Path | None, **query: Any) -> list[KbEntry]:
    _load_agents()  # the knowledge base's types
    settings = _settings(None, state_dir)
    return asyncio.run(knowledge(settings, **query))


def _kb_json(entry: KbEntry) -> dict[str, Any]:
    return entry.model_dump(mode="json")


def _kb_table(entries: list[KbEntry]) -> None:
    table = Table(box=None, pad_edge=False)
    table.add_column("claim id", no_wrap=True)
    table.add_column("confidence")
    table.add_column("flags")
    table.add_column("claim", overflow="fold")
    for entry in entries:
        flags = ", ".join(
            flag for flag, on in (("stale", entry.stale), ("contradicted", entry.contradicts)) if on
        )
        table.add_row(entry.id, entry.confidence, flags, entry.claim)
    console.print(table)
    if not entries:
        err_console.print("[dim]no claim kept yet: `stratagem research` keeps what it finds[/]")


@kb_app.command("list")
def kb_list(state_dir: StateDirOpt = None, as_json: JsonOpt = False) -> None:
    """List every kept claim with its confidence, flagged stale (a cited file changed) or
    contradicted (another kept claim says otherwise).

    Examples:

      stratagem kb list --json
    """
    with _errors():
        entries = _kb(state_dir)
        if as_json:
            _print_json([_kb_json(e) for e in entries])
            return
        _kb_table(entries)


@kb_app.command("search")
def kb_search(
    query: Annotated[str, typer.Argument(help="Words to recall claims by.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 10,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The kept claims best matching the words (full-text recall)."""
    with _errors():
        if not query.strip() or len(query) > 2000:
            raise InputError("query: give 1 to 2000 characters")
        entries = _kb(state_dir, query=query, limit=limit)
        if as_json:
            _print_json([_kb_json(e) for e in entries])
            return
        _kb_table(entries)


@kb_app.command("show")
def kb_show(
    claim_id: Annotated[str, typer.Argument(help="A claim's id (c- and 12 hex digits).")],
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One claim: its citations (file, lines, digest, the quoted sentence), confidence, flags."""
    with _errors():
        if not re.fullmatch(r"c-[0-9a-f]{12}", claim_id):
            raise InputError(f"claim id {claim_id!r}: c- and 12 hex digits are expected")
        entries = _kb(state_dir, claim_id=claim_id)
        if not entries:
            raise InputError(f"claim {claim_id}: not in the knowledge base")
        if as_json:
            _print_json(_kb_json(entries[0]))
            return
        console.print(kb_markdown(entries), highlight=False, soft_wrap=True, markup=False)


@kb_app.command("export")
def kb_export_command(
    fmt: Annotated[
        str, typer.Option("--format", help="yaml, json or md (Markdown for people).")
    ] = "yaml",
    out: Annotated[Path | None, typer.Option("--out", help="Write here, not to stdout.")] = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Export the knowledge base as YAML or JSON (structured) or Markdown (for people)."""
    with _errors():
        if fmt not in ("yaml", "json", "md"):
            raise InputError(f"--format: yaml, json or md, not {fmt!r}")
        text = kb_export(_kb(state_dir), fmt)  # type: ignore[arg-type]
        if out is not None:
            out.write_text(text, encoding="utf-8")
            return
        console.file.write(text)


hypotheses_app = typer.Typer(
    help="Investigations: hypotheses, evidence, confidence, decision table, postmortem.",
    no_args_is_help=True,
)
app.add_typer(hypotheses_app, name="hypotheses")


def _investigations(state_dir: Path | None, investigation_id: str = "") -> list[Investigation]:
    _load_agents()  # the investigations' types
    settings = _settings(None, state_dir)
    return asyncio.run(investigations(settings, investigation_id))


@hypotheses_app.command("list")
def hypotheses_list(state_dir: StateDirOpt = None, as_json: JsonOpt = False) -> None:
    """List the investigations: their hypotheses, the leading one and its confidence, the root
    cause once found."""
    with _errors():
        found = _investigations(state_dir)
        if as_json:
            _print_json([i.model_dump(mode="json") for i in found])
            return
        table = Table(box=None, pad_edge=False)
        for column in ("investigation", "hypotheses", "leading", "root cause"):
            table.add_column(column, overflow="fold")
        for item in found:
            ranked = sorted(item.tracker.ranked(), key=lambda s: -s.confidence)
            lead = f"{ranked[0].hypothesis.id} {ranked[0].confidence:.2f}" if ranked else ""
            table.add_row(item.id, str(len(ranked)), lead, item.root_cause or "-")
        console.print(table)
        if not found:
            err_console.print("[dim]no investigation yet: a plan opens one (hypotheses.open)[/]")


@hypotheses_app.command("show")
def hypotheses_show(
    investigation: Annotated[str, typer.Argument(help="The investigation's id.")],
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One investigation: context, reproduction, hypotheses ranked with their evidence, the
    decision table, root cause and fix (the postmortem's Markdown).

    Examples:

      stratagem hypotheses show debug-unreadable-note
    """
    with _errors():
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", investigation):
            raise InputError(f"investigation {investigation!r}: a lowercase slug is expected")
        found = _investigations(state_dir, investigation)
        if not found:
            raise InputError(f"investigation {investigation}: none kept")
        if as_json:
            item = found[0]
            ranked = [s.model_dump(mode="json") for s in item.tracker.ranked()]
            _print_json(item.model_dump(mode="json") | {"ranked": ranked})
            return
        console.print(postmortem_markdown(found[0]), highlight=False, soft_wrap=True, markup=False)
