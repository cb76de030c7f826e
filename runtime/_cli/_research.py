"""``research``: a research goal over local files and folders, run as a plan, its report printed."""

from __future__ import annotations

import logging
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
    from stratagem.runtime.operator._operator import Operator
    from stratagem.runtime.operator._research import ResearchOutcome, research_plan_for

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())

MAX_GOAL_FILE_BYTES = 64 * 1024
"""The largest research goal file read."""


def _goal_file(path: Path) -> tuple[str, list[str]]:
    """A goal file's question and sources (YAML or JSON: ``question``, ``sources``)."""
    import yaml

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
        Path | None, typer.Option("--out", help="Also write the Markdown report to this file.")
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
        console.print(report.markdown, highlight=False, soft_wrap=True, markup=False)
        unread = len(report.unreadable)
        err_console.print(
            f"plan {outcome.plan_id}: {len(report.claims)} claims from "
            f"{len(report.sources) - unread} sources"
            + (f", {unread} could not be read" if unread else "")
            + f"; report {report.digest}",
            highlight=False,
            soft_wrap=True,
        )
