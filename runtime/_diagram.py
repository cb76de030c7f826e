"""A plan and the sub-plans it caused as a picture: Mermaid flowchart or Graphviz DOT text.

Each plan is a cluster of its steps, coloured by status, with its ``depends_on`` edges; a
cross-agent step points at the cluster of the plan it caused on the target (that plan's id is the
caller's plan id and step id, ``PLAN/STEP``). Only ids the renderer makes itself become node names,
so any plan or step id is safe; labels are escaped for each format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stratagem.runtime._history import PlanView

__all__ = ["DIAGRAM_FORMATS", "DiagramFormat", "plan_diagram"]

DiagramFormat = Literal["mermaid", "dot"]
DIAGRAM_FORMATS: tuple[DiagramFormat, ...] = ("mermaid", "dot")

_FILL = {
    "pending": "#eeeeee",
    "running": "#fff3b0",
    "retrying": "#ffd6f5",
    "blocked": "#ffe0b2",
    "paused": "#e0e0ff",
    "succeeded": "#c8f7c5",
    "failed": "#ffc9c9",
    "compensated": "#d7ccc8",
    "cancelled": "#cfd8dc",
    "skipped": "#f5f5f5",
}


@dataclass(frozen=True, slots=True)
class _Step:
    node: str
    label: str
    status: str
    depends_on: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    cluster: str
    label: str
    steps: dict[str, _Step]
    parent_node: str | None
    """The node of the cross-agent step that caused this plan, if it is in the picture."""


def _what(step: dict[str, Any]) -> str:
    kind = str(step.get("kind", ""))
    if kind == "tool":
        return f"tool {step.get('tool', '')}"
    if kind == "cross_agent":
        return f"{step.get('target', '')}.{step.get('capability', '')}"
    return kind


def _plans(snapshots: Sequence[PlanView], root_plan_id: str) -> list[_Plan]:
    ordered = sorted(
        (
            s
            for s in snapshots
            if s.plan_id == root_plan_id or s.plan_id.startswith(f"{root_plan_id}/")
        ),
        key=lambda s: (s.plan_id.count("/"), s.plan_id),
    )
    step_nodes: dict[str, str] = {}  # "plan/step" -> node name
    plans: list[_Plan] = []
    for index, snap in enumerate(ordered):
        body = snap.plan or {}
        steps: dict[str, _Step] = {}
        for number, raw in enumerate(body.get("steps", [])):
            step_id = str(raw.get("id", number))
            node = f"p{index}s{number}"
            step_nodes[f"{snap.plan_id}/{step_id}"] = node
            steps[step_id] = _Step(
                node=node,
                label=f"{step_id} · {_what(raw)}",
                status=str(raw.get("status", "pending")),
                depends_on=tuple(str(d) for d in raw.get("depends_on") or ()),
            )
        plans.append(
            _Plan(
                cluster=f"p{index}",
                label=f"{snap.agent} · {snap.plan_id} · rev {snap.revision} · {snap.status}",
                steps=steps,
                parent_node=step_nodes.get(snap.plan_id),
            )
        )
    return plans


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _mermaid(plans: list[_Plan]) -> str:
    lines = ["flowchart TD"]
    edges: list[str] = []
    statuses: set[str] = set()
    for plan in plans:
        lines.append(f'  subgraph {plan.cluster}["{_mermaid_text(plan.label)}"]')
        for step in plan.steps.values():
            statuses.add(step.status)
            label = _mermaid_text(f"{step.label} ({step.status})")
            lines.append(f'    {step.node}["{label}"]:::{step.status}')
            for dep in step.depends_on:
                if dep in plan.steps:
                    edges.append(f"  {plan.steps[dep].node} --> {step.node}")
        lines.append("  end")
        if plan.parent_node is not None:
            edges.append(f"  {plan.parent_node} -.-> {plan.cluster}")
    lines += edges
    lines += [
        f"  classDef {status} fill:{_FILL.get(status, '#ffffff')},stroke:#555"
        for status in sorted(statuses)
    ]
    return "\n".join(lines) + "\n"


def _dot(plans: list[_Plan]) -> str:
    lines = [
        "digraph plan {",
        "  rankdir=TB;",
        "  compound=true;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
    ]
    edges: list[str] = []
    for plan in plans:
        lines.append(f"  subgraph cluster_{plan.cluster} {{")
        lines.append(f'    label="{_dot_text(plan.label)}";')
        for step in plan.steps.values():
            fill = _FILL.get(step.status, "#ffffff")
            label = _dot_text(f"{step.label}\n{step.status}")
            lines.append(f'    {step.node} [label="{label}", fillcolor="{fill}"];')
            for dep in step.depends_on:
                if dep in plan.steps:
                    edges.append(f"  {plan.steps[dep].node} -> {step.node};")
        lines.append("  }")
        if plan.parent_node is not None and plan.steps:
            first = next(iter(plan.steps.values())).node
            edges.append(
                f"  {plan.parent_node} -> {first} [style=dashed, lhead=cluster_{plan.cluster}];"
            )
    lines += edges
    lines.append("}")
    return "\n".join(lines) + "\n"


def plan_diagram(snapshots: Sequence[PlanView], root_plan_id: str, fmt: DiagramFormat) -> str:
    """``root_plan_id`` and the plans it caused, as Mermaid (``flowchart``) or DOT text."""
    plans = _plans(snapshots, root_plan_id)
    return _mermaid(plans) if fmt == "mermaid" else _dot(plans)
