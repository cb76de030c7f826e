"""What the plan commands print from the history API: a plan with what each step did (``plans
show``, ``plans run``), a page of plans (``plans list``), events as lines (``plans watch``), recent
traces (``stratagem trace``). Everything here reads the ``runtime.operator._history`` models only.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stratagem.protocol import PlanEvent
from stratagem.runtime.operator._history import (
    HistoryPage,
    PlanHistory,
    PlanView,
    StepView,
    TraceSummary,
)
from stratagem.runtime.operator._render import (
    gate_text,
    lineage_text,
    status_mark,
    status_style,
    status_text,
)

if TYPE_CHECKING:
    from stratagem.planning import ArtifactRef

__all__ = [
    "approve_commands",
    "artifact_line",
    "event_line",
    "history_table",
    "plan_details",
    "traces_table",
    "value_text",
]

_PREVIEW: Final = 160
"""The characters of a value the readable view shows without ``--full``."""


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%m-%d %H:%M:%S") if moment is not None else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s"


def value_text(value: Any, *, full: bool) -> tuple[str, bool]:
    """A step's value as one line of compact JSON, and whether the line was cut here (to
    ``_PREVIEW`` characters unless ``full``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    if full or len(text) <= _PREVIEW:
        return text, False
    return text[: _PREVIEW - 1] + "…", True


def _artifacts_in(output: dict[str, Any] | None) -> list[ArtifactRef]:
    if not output:
        return []
    # planning only where an output may name an artifact: the command line's first tier
    # (which imports this module) leaves planning out
    from stratagem.planning import ArtifactRef

    return ArtifactRef.in_output(output)


def artifact_line(ref: ArtifactRef) -> str:
    """An artifact version in one line: its name, version, size and digest."""
    return f"{ref.name} v{ref.version} · {ref.size} B · sha256:{ref.digest} ({ref.key})"


def _step_node(step: StepView, *, full: bool) -> Text:
    label = Text()
    label.append_text(status_text(step.status))
    label.append(f"  {step.id}", style="bold")
    if step.kind == "tool":
        label.append(f"  tool {step.does}", style="cyan")
    elif step.kind == "cross_agent":
        label.append(f"  → {step.does}", style="blue")
    else:
        label.append(f"  {step.kind}")
    facts = []
    if step.attempts:
        facts.append(f"{step.attempts} attempt{'s' if step.attempts != 1 else ''}")
    if (took := _duration(step.duration_s)) and step.ended is not None:
        facts.append(took)
    if step.revision > 1 or step.author:
        facts.append(f"rev {step.revision}" + (f" by {step.author}" if step.author else ""))
    if facts:
        label.append("  " + " · ".join(facts), style="dim")
    cut = step.cut
    for name, value in (("input", step.input), ("output", step.output)):
        if value is None:
            continue
        text, shortened = value_text(value, full=full)
        cut = cut or shortened
        label.append(f"\n  {name:<6} ", style="dim")
        label.append(text)
    for made in _artifacts_in(step.output):
        label.append("\n  artifact ", style="dim")
        label.append(artifact_line(made), style="green")
    if step.failure_class:
        label.append("\n  error  ", style="dim")
        label.append(f"{step.failure_class}: {step.message}", style="red")
    elif step.message:
        label.append("\n  note   ", style="dim")
        label.append(step.message)
    if cut:
        label.append(
            "\n  (values cut: 'plans show --full' prints them whole)"
            if not full
            else "\n  (values cut to fit the agent's message limit)",
            style="dim italic",
        )
    return label


def _plan_node(view: PlanView, root: str) -> Text:
    # A sub-plan by its id's tail under the root's (``…/extract``), as the plan forest names it.
    shown = "…" + view.plan_id[len(root) :] if view.plan_id.startswith(root + "/") else view.plan_id
    text = Text.assemble((view.agent, "bold magenta"), f" plan {shown} rev {view.revision} ")
    text.append_text(status_text(view.status))
    if view.goal:
        text.append(f"  {view.goal}", style="italic")
    return text


def plan_details(history: PlanHistory, *, full: bool = False) -> RenderableType:
    """A plan and its sub-plans as a tree with what each step did; a failed plan opens with the
    one line naming where it went wrong, and the trace id follows."""
    lines: list[RenderableType] = []
    if history.failure:
        lines.append(Text(f"✗ {history.status}: {history.failure}", style="bold red"))
    by_id = {view.plan_id: view for view in history.plans}
    root = Tree(Text(history.plan_id, style="bold"))
    shown: set[str] = set()

    def add(parent: Tree, view: PlanView) -> None:
        shown.add(view.plan_id)
        node = parent.add(_plan_node(view, history.plan_id))
        lineage = lineage_text((view.plan or {}).get("forked_from"))
        if lineage is not None:
            node.add(lineage)
        if view.message and not view.failure and view.status != "succeeded":
            node.add(Text(view.message, style="dim"))
        gates = {gate.gate_id: gate for gate in view.gates}
        for step in view.steps:
            child = node.add(_step_node(step, full=full))
            gate = gates.get(step.id)
            if gate is not None:
                child.add(gate_text(gate))
            sub = by_id.get(step.sub_plan) if step.sub_plan else None
            if sub is not None:
                add(child, sub)

    for view in history.plans:
        if view.plan_id not in shown and (
            view.plan_id == history.plan_id or not _has_parent(view.plan_id, by_id)
        ):
            add(root, view)
    lines.append(root)
    if history.trace_id:
        lines.append(Text(f"trace {history.trace_id}  (stratagem trace {history.trace_id})"))
    for line in history.unreadable:
        lines.append(Text(f"not read: {line}", style="yellow"))
    return Group(*lines)


def _has_parent(plan_id: str, by_id: dict[str, PlanView]) -> bool:
    parent, slash, _ = plan_id.rpartition("/")
    return bool(slash) and parent in by_id


def approve_commands(view: PlanView) -> list[str]:
    """The ``approve`` command of each gate ``view`` waits at (what ``plans run`` prints); a
    gate that asks for a value gets ``--value`` with one of its choices, or a placeholder."""
    asks = {
        gate.gate_id: gate for gate in view.gates if gate.choices_json or gate.input_schema_json
    }
    commands = []
    for step in view.steps:
        if step.status != "blocked":
            continue
        command = (
            f"stratagem approve {shlex.quote(view.plan_id)} {shlex.quote(step.id)} "
            "--rationale 'why it may go on'"
        )
        gate = asks.get(step.id)
        if gate is not None:
            command += " --value " + shlex.quote(_example_value(gate.choices_json))
        commands.append(command)
    return commands


def _example_value(choices_json: str) -> str:
    """One of a gate's choices as JSON, or ``VALUE`` for a gate with a schema."""
    try:
        choices = json.loads(choices_json) if choices_json else []
    except ValueError:
        choices = []
    return json.dumps(choices[0], separators=(",", ":")) if choices else "VALUE"


_NARROW: Final = 100
"""Terminal columns below which a status is its mark alone."""
_WIDE: Final = 120
"""Terminal columns from which the tables add a note (why a plan failed, a trace's goal)."""


def history_table(page: HistoryPage, width: int = _WIDE) -> Table:
    """A page of plans: when, agent, plan, rev, status, trace (short), and in a terminal of
    ``_WIDE`` columns or more why a plan failed (one line; ``plans show`` has it whole)."""
    wide = width >= _WIDE
    # Below 100 columns a status is its mark alone (as in the plan tree): the plan id gets the room.
    marks = width < _NARROW
    table = Table(box=None, pad_edge=False)
    table.add_column("created", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("plan", overflow="fold", min_width=12)
    table.add_column("rev", no_wrap=True, justify="right")
    table.add_column("" if marks else "status", no_wrap=True)
    table.add_column("trace", no_wrap=True)
    # A page of top-level plans says how many sub-plans each folds (``plans list --all``: all).
    folded = bool(page.sub_plans)
    if folded:
        table.add_column("sub-plans" if wide else "subs", no_wrap=True, justify="right")
    if wide:
        table.add_column(
            "note", no_wrap=True, overflow="ellipsis", max_width=width - (100 if folded else 90)
        )
    for view in page.plans:
        note = view.failure or (view.message if view.status != "succeeded" else "")
        subs = page.sub_plans.get(view.plan_id, 0)
        table.add_row(
            _when(view.created),
            view.agent,
            view.plan_id,
            str(view.revision),
            status_mark(view.status) if marks else status_text(view.status),
            view.trace_id[:8],
            *([f"+{subs}" if subs else ""] if folded else []),
            *([note] if wide else []),
        )
    return table


def traces_table(traces: Sequence[TraceSummary], width: int = _WIDE) -> Table:
    """Recent traces: when, trace id, status, plans/agents, first plan; the goal when wide."""
    wide = width >= _WIDE
    table = Table(box=None, pad_edge=False)
    table.add_column("created", no_wrap=True)
    table.add_column("trace", no_wrap=True, min_width=32)
    table.add_column("status", no_wrap=True)
    table.add_column("plans", no_wrap=True, justify="right")
    table.add_column("plan", overflow="fold", min_width=12)
    if wide:
        table.add_column("goal", no_wrap=True, overflow="ellipsis", max_width=width - 100)
    for entry in traces:
        table.add_row(
            _when(entry.created),
            entry.trace_id,
            status_text(entry.status),
            f"{entry.plans}/{len(entry.agents)}",
            entry.plan_id,
            *([entry.goal] if wide else []),
        )
    return table


def event_line(event: PlanEvent, fallback_agent: str = "") -> Text:
    """One event as a line: ``strategic gated step ok -> blocked, waiting for approval: Go
    ahead?``, ``perception p step s -> failed (logic): why``."""
    line = Text()
    line.append(f"{event.agent or fallback_agent} ", style="magenta")
    line.append(event.plan_id)
    if event.step_id:
        line.append(f" step {event.step_id}")
    line.append(" -> ")
    line.append(event.status, style=status_style(event.status))
    if event.attempt > 1:
        line.append(f" (attempt {event.attempt})", style="dim")
    if event.failure_class:
        line.append(f" ({event.failure_class})", style="red")
    if event.status == "blocked" and event.message:
        line.append(", waiting for approval: ")
        line.append(event.message)
    elif event.message:
        line.append(": ")
        line.append(event.message)
    if event.gate is not None:
        line.append(" [")
        line.append_text(gate_text(event.gate))
        line.append("]")
    return line
