"""Terminal rendering for the CLI: live progress, plan trees, trace waterfalls, results."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stratagem.protocol import Action, GateInfo, PlanEvent, Relation
from stratagem.runtime.operator._history import PlanView
from stratagem.runtime.telemetry._telemetry import SpanRecord

__all__ = [
    "Progress",
    "action_text",
    "plan_forest",
    "relation_text",
    "span_json",
    "span_tree",
    "status_style",
    "status_text",
]

_STATUS_STYLE = {
    "pending": "dim",
    "running": "yellow",
    "retrying": "magenta",
    "succeeded": "green",
    "failed": "bold red",
    "skipped": "dim",
    "cancelled": "red",
    "blocked": "cyan",
    "paused": "cyan",
    "compensating": "magenta",
    "compensated": "magenta",
    "compensation_failed": "bold red",
}
_STATUS_MARK = {
    "pending": "·",
    "running": "▶",
    "retrying": "↻",
    "succeeded": "✓",
    "failed": "✗",
    "skipped": "-",
    "cancelled": "✗",
    "blocked": "⏸",
    "paused": "⏸",
    "compensating": "↺",
    "compensated": "↺",
    "compensation_failed": "✗",
}


def status_text(status: str) -> Text:
    """A status with its mark and colour (``✓ succeeded`` in green)."""
    return Text(f"{_STATUS_MARK.get(status, '?')} {status}", style=_STATUS_STYLE.get(status, ""))


def status_mark(status: str) -> Text:
    """A status as its mark alone, in its colour (``✓`` in green): for narrow terminals."""
    return Text(_STATUS_MARK.get(status, "?"), style=_STATUS_STYLE.get(status, ""))


def status_style(status: str) -> str:
    """A status's colour."""
    return _STATUS_STYLE.get(status, "bold")


_status = status_text


@dataclass
class Progress:
    """Live view of a goal: the latest state of every step of every plan, fed by Watch events."""

    started: float = field(default_factory=time.monotonic)
    steps: dict[tuple[str, str, str], PlanEvent] = field(default_factory=dict)
    plans: dict[tuple[str, str], PlanEvent] = field(default_factory=dict)

    def add(self, event: PlanEvent) -> None:
        """Record one event (later events for the same step replace earlier ones)."""
        if event.step_id:
            self.steps[(event.agent, event.plan_id, event.step_id)] = event
        else:
            self.plans[(event.agent, event.plan_id)] = event

    def render(self) -> RenderableType:
        """A table of steps with their agent, status and attempt."""
        done = sum(1 for e in self.steps.values() if e.status in ("succeeded", "skipped"))
        table = Table(
            title=f"{done}/{len(self.steps)} steps done · {time.monotonic() - self.started:.1f}s",
            title_justify="left",
            expand=False,
        )
        table.add_column("agent")
        table.add_column("plan")
        table.add_column("step")
        table.add_column("status")
        table.add_column("try", justify="right")
        table.add_column("note", overflow="fold", max_width=60)
        for (agent, plan_id, step_id), event in sorted(
            self.steps.items(), key=lambda item: item[1].timestamp
        ):
            table.add_row(
                agent,
                plan_id.rsplit("/", 1)[-1] if "/" in plan_id else plan_id,
                step_id,
                _status(event.status),
                str(event.attempt or ""),
                event.message,
            )
        return table


def _step_label(step: dict[str, Any], *, compact: bool = False) -> Text:
    kind = step.get("kind", "")
    status = str(step.get("status", "pending"))
    label = Text()
    if compact:  # the mark alone: its colour and shape say the status
        label.append(_STATUS_MARK.get(status, "?"), style=_STATUS_STYLE.get(status, ""))
    else:
        label.append_text(_status(status))
    label.append(f"  {step.get('id', '?')}", style="bold")
    if kind == "tool":
        label.append(f"  tool {step.get('tool', '')}", style="cyan")
    elif kind == "cross_agent":
        label.append(f"  → {step.get('target', '')}.{step.get('capability', '')}", style="blue")
    else:
        label.append(f"  {kind}")
    deps = step.get("depends_on") or []
    if deps:
        label.append(f"  after {', '.join(deps)}", style="dim")
    return label


def plan_forest(
    snapshots: Sequence[PlanView], root_plan_id: str, *, width: int | None = None
) -> Tree:
    """Every agent's plan for one goal as one tree: a cross-agent step holds the plan it caused
    (named by its id's tail under the root's, ``…/extract``; a revision only past the first).
    Below 100 columns (``width``) a step's status is its mark alone (``✓``, ``✗``, ``⏸``…)."""
    compact = width is not None and width < 100
    by_id = {snap.plan_id: snap for snap in snapshots}
    root = Tree(Text(root_plan_id, style="bold"))

    def add_plan(parent: Tree, snap: PlanView) -> None:
        plan = snap.plan or {}
        shown = snap.plan_id
        if shown.startswith(root_plan_id + "/"):
            shown = "…" + shown[len(root_plan_id) :]
        revision = f" rev {snap.revision}" if snap.revision > 1 else ""
        node = parent.add(
            Text.assemble(
                (f"{snap.agent}", "bold magenta"),
                f" plan {shown}{revision} ",
                _status(snap.status),
            )
        )
        lineage = _lineage(plan.get("forked_from"))
        if lineage is not None:
            node.add(lineage)
        gates = {gate.gate_id: gate for gate in snap.gates}
        for step in plan.get("steps", []):
            child = node.add(_step_label(step, compact=compact))
            gate = gates.get(str(step.get("id")))
            if gate is not None:
                child.add(gate_text(gate))
            sub = by_id.get(f"{snap.plan_id}/{step.get('id')}")
            if sub is not None:
                add_plan(child, sub)

    top = by_id.get(root_plan_id)
    if top is not None:
        add_plan(root, top)
    else:
        for snap in snapshots:
            if "/" not in snap.plan_id.removeprefix(root_plan_id).strip("/"):
                add_plan(root, snap)
    return root


def lineage_text(fork: Any) -> Text | None:
    """A fork's line (a plan's ``forked_from``), or ``None`` for a plan that is no fork."""
    return _lineage(fork)


def _lineage(fork: Any) -> Text | None:
    """``forked from plan P revision N at step S (carried a, b; substituted b) by ana``."""
    if not isinstance(fork, dict):
        return None
    text = f"forked from plan {fork.get('plan_id')} revision {fork.get('revision')}"
    if fork.get("at_step"):
        text += f" at step {fork['at_step']}"
    carried = ", ".join(fork.get("carried") or []) or "nothing"
    text += f" (carried {carried}"
    if fork.get("substituted"):
        text += f"; substituted {', '.join(fork['substituted'])}"
    text += ")"
    if fork.get("author"):
        text += f" by {fork['author']}"
    return Text(text, style="italic")


def gate_text(gate: GateInfo) -> Text:
    """One line about a gate: what it asks, who decides, when it times out, what was decided."""
    kind = "gate" if gate.kind == "gate" else f"{gate.kind} gate"
    parts = [f"{kind} {gate.event.replace('_', ' ')}"]
    if gate.tool:
        parts.append(f"tool {gate.tool} with {gate.arguments_json or '{}'}")
    if gate.choices_json:
        parts.append(f"choices {gate.choices_json}")
    elif gate.input_schema_json:
        parts.append("asks a value (input_schema)")
    if gate.deciders:
        parts.append(f"for {', '.join(gate.deciders)}")
    if gate.decision:
        decided = f"{gate.decision} by {gate.approver}"
        if gate.value_json:
            decided += f" with {gate.value_json}"
        parts.append(decided)
    else:
        if gate.deadline:
            parts.append(f"times out {_when(gate.deadline)}")
        if gate.escalate_at:
            parts.append(f"escalates {_when(gate.escalate_at)}")
    return Text("; ".join(parts), style="yellow" if not gate.decision else "dim")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def relation_text(rel: Relation) -> str:
    """``at(mira, courtyard)``."""
    return f"{rel.predicate}({rel.subject}, {rel.object})"


def action_text(action: Action) -> str:
    """``move(mira, courtyard, north_tower)``."""
    return f"{action.name}({', '.join(action.args)})"


def _span_rows(records: Sequence[SpanRecord]) -> list[tuple[str, SpanRecord, list[SpanRecord]]]:
    """Depth-first rows of a trace: (tree guide, span, its children), children in start order.

    A span whose parent is not in ``records`` (its process lost it, or the trace started
    elsewhere) is shown as a root.
    """
    ids = {r.span_id for r in records}
    children: dict[str, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    for record in sorted(records, key=lambda r: (r.start, r.end)):
        if record.parent_id and record.parent_id in ids and record.parent_id != record.span_id:
            children.setdefault(record.parent_id, []).append(record)
        else:
            roots.append(record)
    rows: list[tuple[str, SpanRecord, list[SpanRecord]]] = []

    def walk(record: SpanRecord, guide: str, last: bool, depth: int) -> None:
        kids = children.get(record.span_id, [])
        rows.append((guide + ("" if depth == 0 else "└─ " if last else "├─ "), record, kids))
        below = guide + ("" if depth == 0 else "   " if last else "│  ")
        for i, kid in enumerate(kids):
            walk(kid, below, i == len(kids) - 1, depth + 1)

    for root in roots:
        walk(root, "", True, 0)
    return rows


def _events_text(record: SpanRecord) -> str:
    """``retry x2, gate.blocked``: the span's events by name, in order of first occurrence."""
    counts: dict[str, int] = {}
    for event in record.events:
        name = str(event.get("name", "?"))
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def _bar(offset: int, duration: int, total: int, width: int, error: bool) -> Text:
    """The span's place in the trace: blank up to its start, a bar as long as it lasted."""
    lead = min(width - 1, int(offset / total * width)) if total else 0
    length = max(1, round(duration / total * width)) if total else width
    length = min(length, width - lead)
    return Text.assemble(
        " " * lead, ("█" * length, "red" if error else "green"), " " * (width - lead - length)
    )


WIDE: Final = 140
"""From this console width up, ``span_tree`` shows every column; below it, a compact layout."""


def span_tree(
    spans: Iterable[SpanRecord], *, bar_width: int = 32, width: int | None = None
) -> RenderableType:
    """A trace as a waterfall: the span tree with each span's service, start offset, duration,
    a bar scaled to the whole trace, its events and its status (errors in red).

    Args:
        spans: The trace's spans.
        bar_width: The waterfall's width in the full layout.
        width: The console's width: below ``WIDE`` the layout is compact, to fit it (shorter
            span names and tree guides, services without their ``stratagem-`` prefix, events
            after the name, no start column, the bar sized to what is left).
    """
    records = list(spans)
    if not records:
        return Text("no spans recorded", style="dim")
    t0 = min(r.start for r in records)
    total = max(r.end for r in records) - t0
    title = f"trace {records[0].trace_id} · {len(records)} spans · {total / 1e6:.1f}ms"
    if width is not None and width < WIDE:
        return _compact_span_tree(records, t0, total, title, width)
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("span", no_wrap=True)
    table.add_column("service", style="magenta", no_wrap=True)
    table.add_column("start", justify="right", style="dim", no_wrap=True)
    table.add_column("duration", justify="right", style="cyan", no_wrap=True)
    table.add_column("waterfall", no_wrap=True)
    table.add_column("events", style="yellow")
    table.add_column("status", no_wrap=True)
    for guide, r, _ in _span_rows(records):
        error = r.status == "ERROR"
        table.add_row(
            Text.assemble((guide, "dim"), (_span_title(r), "bold red" if error else "bold")),
            r.service,
            f"+{(r.start - t0) / 1e6:.1f}ms",
            f"{r.duration_ms:.1f}ms",
            _bar(r.start - t0, r.end - r.start, total, bar_width, error),
            _events_text(r),
            Text("✗ ERROR", style="bold red") if error else Text("✓ ok", style="green"),
        )
    return table


def _compact_span_tree(
    records: list[SpanRecord], t0: int, total: int, title: str, width: int
) -> RenderableType:
    """``span_tree`` for a console narrower than ``WIDE`` (see there)."""
    rows = _span_rows(records)
    services = [r.service.removeprefix("stratagem-") for _, r, _ in rows]
    durations = [_duration(r.duration_ms) for _, r, _ in rows]
    service_w = min(12, max(len(s) for s in services))
    duration_w = max(len(d) for d in durations)
    # Four gaps of one space between five columns, and the status mark's one character.
    rest = width - service_w - duration_w - 4 - 1
    bar_w = max(6, min(24, rest // 4))
    span_w = max(10, rest - bar_w)
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("span", no_wrap=True, overflow="ellipsis", width=span_w)
    table.add_column("service", style="magenta", no_wrap=True, overflow="ellipsis", width=service_w)
    table.add_column("took", justify="right", style="cyan", no_wrap=True, width=duration_w)
    table.add_column("waterfall", no_wrap=True, width=bar_w)
    table.add_column("", no_wrap=True, width=1)
    for (guide, r, _), service, duration in zip(rows, services, durations, strict=True):
        error = r.status == "ERROR"
        narrow = _narrow_guide(guide)
        events = f" {_events_text(r)}" if r.events else ""
        # The events are kept whole; the name gives way.
        title = _short_title(r)
        room = max(4, span_w - len(narrow) - len(events))
        if len(title) > room:
            title = title[: room - 1] + "…"
        name = Text.assemble((narrow, "dim"), (title, "bold red" if error else "bold"))
        name.append(events, style="yellow")
        table.add_row(
            name,
            service,
            duration,
            _bar(r.start - t0, r.end - r.start, total, bar_w, error),
            Text("✗", style="bold red") if error else Text("✓", style="green"),
        )
    return table


_NARROW = {"│  ": "│ ", "   ": "  ", "├─ ": "├ ", "└─ ": "└ "}


def _narrow_guide(guide: str) -> str:
    """A tree guide two characters a level instead of three (``├─ `` becomes ``├ ``)."""
    return "".join(_NARROW.get(guide[i : i + 3], guide[i : i + 3]) for i in range(0, len(guide), 3))


def _duration(ms: float) -> str:
    return f"{ms:.1f}ms" if ms < 10_000 else f"{ms / 1000:.1f}s"


def _short_title(record: SpanRecord) -> str:
    """A span's name, shorter: an RPC as ``call``/``serve`` and its capability or method, a tool
    step as its step's id and its tool."""
    attributes = record.attributes
    if attributes.get("rpc.system") == "grpc":
        what = attributes.get("stratagem.capability") or attributes.get("rpc.method", "")
        verb = {"CLIENT": "call", "SERVER": "serve"}.get(record.kind, "rpc")
        return f"{verb} {what}"
    if attributes.get("gen_ai.operation.name") == "execute_tool" and record.name.startswith(
        "step "
    ):
        return f"{record.name.removeprefix('step ')} · {attributes.get('gen_ai.tool.name', '?')}"
    return record.name


def _span_title(record: SpanRecord) -> str:
    """A span's name; a step whose attempt is a tool call names the tool too."""
    attributes = record.attributes
    if attributes.get("gen_ai.operation.name") == "execute_tool" and not record.name.startswith(
        "execute_tool"
    ):
        return f"{record.name} · tool {attributes.get('gen_ai.tool.name', '?')}"
    return record.name


def span_json(spans: Iterable[SpanRecord]) -> list[dict[str, Any]]:
    """A trace as a JSON tree: each span's fields, its offset and duration in ms, ``children``."""
    records = list(spans)
    if not records:
        return []
    t0 = min(r.start for r in records)
    rows = _span_rows(records)
    nodes: dict[str, dict[str, Any]] = {}
    for _, r, _kids in rows:
        nodes[r.span_id] = {
            **dataclasses.asdict(r),
            "offset_ms": (r.start - t0) / 1e6,
            "duration_ms": r.duration_ms,
            "children": [],
        }
    roots: list[dict[str, Any]] = []
    for guide, r, kids in rows:
        if not guide:
            roots.append(nodes[r.span_id])
        nodes[r.span_id]["children"] = [nodes[k.span_id] for k in kids]
    return roots


def group(*items: RenderableType) -> Group:
    """Render several items one after another."""
    return Group(*items)
