"""Terminal rendering for the CLI: live progress, plan trees, span trees, results."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from protocol import Action, PlanEvent, PlanSnapshot, Relation
from runtime._telemetry import SpanRecord

__all__ = ["Progress", "action_text", "plan_forest", "relation_text", "span_tree"]

_STATUS_STYLE = {
    "pending": "dim",
    "running": "yellow",
    "retrying": "magenta",
    "succeeded": "green",
    "failed": "bold red",
    "skipped": "dim",
    "cancelled": "red",
    "blocked": "cyan",
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
}


def _status(status: str) -> Text:
    return Text(f"{_STATUS_MARK.get(status, '?')} {status}", style=_STATUS_STYLE.get(status, ""))


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


def plan_forest(snapshots: Sequence[PlanSnapshot], root_plan_id: str) -> Tree:
    """Every agent's plan for one goal as one tree: a cross-agent step holds the plan it caused."""
    by_id = {snap.plan_id: snap for snap in snapshots}
    root = Tree(Text(root_plan_id, style="bold"))

    def add_plan(parent: Tree, snap: PlanSnapshot) -> None:
        plan = json.loads(snap.plan_json)
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


def span_tree(spans: Iterable[SpanRecord]) -> Tree | Text:
    """A trace as a waterfall-ish tree: name, service, duration, status."""
    records = list(spans)
    if not records:
        return Text("no spans recorded", style="dim")
    ids = {r.span_id for r in records}
    children: dict[str, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    for record in records:
        if record.parent_id and record.parent_id in ids:
            children.setdefault(record.parent_id, []).append(record)
        else:
            roots.append(record)
    t0 = min(r.start for r in records)

    def label(r: SpanRecord) -> Text:
        style = "red" if r.status == "ERROR" else ""
        return Text.assemble(
            (r.name, "bold " + style),
            (f"  {r.service}", "magenta"),
            (f"  +{(r.start - t0) / 1e6:.1f}ms", "dim"),
            (f"  {r.duration_ms:.1f}ms", "cyan"),
            (f"  {r.status}" if r.status == "ERROR" else "", "red"),
        )

    def add(node: Tree, r: SpanRecord) -> None:
        child = node.add(label(r))
        for c in children.get(r.span_id, []):
            add(child, c)

    tree = Tree(Text(f"trace {records[0].trace_id}", style="bold"))
    for r in roots:
        add(tree, r)
    return tree


def group(*items: RenderableType) -> Group:
    """Render several items one after another."""
    return Group(*items)
