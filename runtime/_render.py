"""Terminal rendering for the CLI: live progress, plan trees, trace waterfalls, results."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stratagem.protocol import Action, PlanEvent, Relation
from stratagem.runtime._history import PlanView
from stratagem.runtime._telemetry import SpanRecord

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


def _step_label(step: dict[str, Any]) -> Text:
    kind = step.get("kind", "")
    status = str(step.get("status", "pending"))
    label = Text()
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


def plan_forest(snapshots: Sequence[PlanView], root_plan_id: str) -> Tree:
    """Every agent's plan for one goal as one tree: a cross-agent step holds the plan it caused."""
    by_id = {snap.plan_id: snap for snap in snapshots}
    root = Tree(Text(root_plan_id, style="bold"))

    def add_plan(parent: Tree, snap: PlanView) -> None:
        plan = snap.plan or {}
        node = parent.add(
            Text.assemble(
                (f"{snap.agent}", "bold magenta"),
                f" plan {snap.plan_id} rev {snap.revision} ",
                _status(snap.status),
            )
        )
        for step in plan.get("steps", []):
            child = node.add(_step_label(step))
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


def span_tree(spans: Iterable[SpanRecord], *, bar_width: int = 32) -> RenderableType:
    """A trace as a waterfall: the span tree with each span's service, start offset, duration,
    a bar scaled to the whole trace, its events and its status (errors in red)."""
    records = list(spans)
    if not records:
        return Text("no spans recorded", style="dim")
    t0 = min(r.start for r in records)
    total = max(r.end for r in records) - t0
    table = Table(
        title=f"trace {records[0].trace_id} · {len(records)} spans · {total / 1e6:.1f}ms",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
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
