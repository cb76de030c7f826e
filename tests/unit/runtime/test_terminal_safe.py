"""Stored data never drives the terminal: the CLI writes control characters out (``\\x1b``), in
tables, trees and lines alike, while its own styling still works."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from stratagem.runtime import SpanRecord
from stratagem.runtime._cli import _app as cli
from stratagem.runtime.operator._history import HistoryPage, PlanHistory, PlanView
from stratagem.runtime.operator._show import history_table, plan_details

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
# Clear the screen, retitle the window, ring the bell, return to the line's start.
HOSTILE = "take \x1b[2J\x1b]0;pwned\x07 the key\r\x9b"


def _view(plan_id: str) -> PlanView:
    now = datetime.now(UTC)
    return PlanView(
        plan_id=plan_id,
        agent="orchestrator",
        revision=1,
        status="succeeded",
        created=now,
        updated=now,
        goal=HOSTILE,
        message=HOSTILE,
        trace_id=TRACE,
    )


def _printed(*renderables: object) -> str:
    with cli.console.capture() as captured:
        for renderable in renderables:
            cli.console.print(renderable)
    return captured.get()


def test_a_goal_with_control_characters_is_written_out_in_show_and_list() -> None:
    # Before: the ESC, BEL and CR went to the terminal as they were (plans show cleared it).
    shown = plan_details(
        PlanHistory(plan_id="goal-1", status="failed", failure=HOSTILE, plans=[_view("goal-1")])
    )
    out = _printed(shown, history_table(HistoryPage(plans=[_view("g")]), 200))
    for control in ("\x1b", "\x07", "\r", "\x9b"):
        assert control not in out
    # (rich itself drops BEL and CR from a text; the rest is written out)
    assert "take \\x1b[2J\\x1b]0;pwned the key\\x9b" in out


def test_the_trace_command_writes_control_characters_out(tmp_path: Path) -> None:
    span = SpanRecord(
        trace_id=TRACE,
        span_id="1" * 16,
        parent_id="",
        name=f"plan {HOSTILE}",
        kind="INTERNAL",
        start=1_000_000,
        end=2_000_000,
        status="ERROR",
        service="orchestrator",
        pid=1,
        attributes={"stratagem.plan.goal": HOSTILE},
        events=[],
    )
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(dataclasses.asdict(span)) + "\n")
    result = CliRunner().invoke(cli.app, ["trace", TRACE, "--file", str(path)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert "\\x1b[2J" in result.stdout


def test_terminal_safe_keeps_text_tabs_and_newlines() -> None:
    assert cli.terminal_safe("a\tb\nc é ✓") == "a\tb\nc é ✓"
    assert cli.terminal_safe("\x00\x1b\x7f") == "\\x00\\x1b\\x7f"
