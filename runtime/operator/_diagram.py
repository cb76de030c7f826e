"""A plan and the sub-plans it caused as a picture: Mermaid flowchart or Graphviz DOT text.

Each plan is a cluster of its steps, coloured by status, with its ``depends_on`` edges; a
cross-agent step points at the cluster of the plan it caused on the target (that plan's id is the
caller's plan id and step id, ``PLAN/STEP``), and so does a sub-plan or a loop at the nested
plans it ran (``PLAN/STEP``, ``PLAN/STEP.N``). Branches are drawn on their edges: an edge into a
step with a condition is labelled ``when ...``, one into a step that runs on failure is dotted
and labelled ``on failure``. A map is a node of its own shape naming its list and bounds; a loop
(with an edge back to itself: ``repeat until ...``) and a sub-plan are nodes whose body is drawn
beside them as a cluster of its own. Only ids the renderer makes itself become node names, so any
plan or step id is safe; labels are escaped for each format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stratagem.runtime.operator._history import PlanView

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


_SHOWN = 60  # the longest expression quoted in a label


@dataclass(frozen=True, slots=True)
class _Step:
    node: str
    label: str
    status: str
    depends_on: tuple[str, ...]
    kind: str = "tool"
    when: str = ""
    on_failure: bool = False
    until: str = ""  # a loop's condition ("" for any other step)
    body: _Body | None = None  # a loop's or a sub-plan's body


@dataclass(frozen=True, slots=True)
class _Body:
    cluster: str
    label: str
    steps: dict[str, _Step]


@dataclass(frozen=True, slots=True)
class _Plan:
    cluster: str
    label: str
    steps: dict[str, _Step]
    parent_node: str | None
    """The node of the step that caused this plan (cross-agent, sub-plan, loop), if shown."""


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _what(step: dict[str, Any]) -> str:
    kind = str(step.get("kind", ""))
    if kind == "tool":
        what = f"tool {step.get('tool', '')}"
    elif kind == "cross_agent":
        what = f"{step.get('target', '')}.{step.get('capability', '')}"
    elif kind == "map":
        work = (
            f"tool {step.get('tool')}"
            if step.get("tool")
            else f"{step.get('target', '')}.{step.get('capability', '')}"
        )
        bounds = f"at most {step.get('max_items', '?')}, {step.get('max_parallel', 4)} at once"
        what = f"map over {_short(str(step.get('over', '')))} ({bounds}) · {work}"
    elif kind == "loop":
        limits = []
        if step.get("max_iterations") is not None:
            limits.append(f"at most {step['max_iterations']}")
        if step.get("timebox_s") is not None:
            limits.append(f"timebox {step['timebox_s']:g}s")
        what = f"loop ({', '.join(limits)})"
    elif kind == "subplan":
        what = "sub-plan"
    else:
        what = kind
    priority = step.get("priority") or 0
    return f"{what} · priority {priority}" if priority else what


def _steps(raw_steps: list[dict[str, Any]], prefix: str) -> dict[str, _Step]:
    steps: dict[str, _Step] = {}
    for number, raw in enumerate(raw_steps):
        step_id = str(raw.get("id", number))
        node = f"{prefix}s{number}"
        kind = str(raw.get("kind", ""))
        body = None
        if kind in ("loop", "subplan") and isinstance(raw.get("steps"), list):
            body = _Body(
                cluster=f"{node}b",
                label=f"body of {step_id}"
                + (" (one plan per iteration)" if kind == "loop" else ""),
                steps=_steps(raw["steps"], f"{node}b"),
            )
        steps[step_id] = _Step(
            node=node,
            label=f"{step_id} · {_what(raw)}",
            status=str(raw.get("status", "pending")),
            depends_on=tuple(str(d) for d in raw.get("depends_on") or ()),
            kind=kind,
            when=str(raw.get("when") or ""),
            on_failure=raw.get("runs_on") == "failure",
            until=str(raw.get("until") or "") if kind == "loop" else "",
            body=body,
        )
    return steps


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
        steps = _steps(body.get("steps", []), f"p{index}")
        for step_id, step in steps.items():
            step_nodes[f"{snap.plan_id}/{step_id}"] = step.node
        # A loop's iteration is PLAN/STEP.N (PLAN/STEP.rR.N after a replan): its step's node.
        parent, _, last = snap.plan_id.rpartition("/")
        caused_by = step_nodes.get(snap.plan_id) or step_nodes.get(
            f"{parent}/{last.partition('.')[0]}"
        )
        plans.append(
            _Plan(
                cluster=f"p{index}",
                label=f"{snap.agent} · {snap.plan_id} · rev {snap.revision} · {snap.status}",
                steps=steps,
                parent_node=caused_by,
            )
        )
    return plans


def _edge_label(step: _Step) -> str:
    """What an edge into ``step`` says: its route on failure, its condition."""
    parts = []
    if step.on_failure:
        parts.append("on failure")
    if step.when:
        parts.append(f"when {_short(step.when)}")
    return "; ".join(parts)


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


_MERMAID_SHAPES = {"map": ('[["', '"]]'), "loop": ('{{"', '"}}'), "subplan": ('[/"', '"/]')}


def _mermaid_steps(
    steps: dict[str, _Step], indent: str, lines: list[str], edges: list[str], statuses: set[str]
) -> None:
    for step in steps.values():
        statuses.add(step.status)
        label = _mermaid_text(f"{step.label} ({step.status})")
        opening, closing = _MERMAID_SHAPES.get(step.kind, ('["', '"]'))
        lines.append(f"{indent}{step.node}{opening}{label}{closing}:::{step.status}")
        said = _mermaid_text(_edge_label(step))
        for dep in step.depends_on:
            if dep not in steps:
                continue
            source = steps[dep].node
            if step.on_failure:
                edges.append(f'  {source} -.->|"{said}"| {step.node}')
            elif said:
                edges.append(f'  {source} -->|"{said}"| {step.node}')
            else:
                edges.append(f"  {source} --> {step.node}")
        if step.until:
            said = _mermaid_text(f"repeat until {_short(step.until)}")
            edges.append(f'  {step.node} -->|"{said}"| {step.node}')
        if step.body is not None:
            lines.append(
                f'{indent}subgraph {step.body.cluster}["{_mermaid_text(step.body.label)}"]'
            )
            _mermaid_steps(step.body.steps, indent + "  ", lines, edges, statuses)
            lines.append(f"{indent}end")
            edges.append(f"  {step.node} -.-> {step.body.cluster}")


def _mermaid(plans: list[_Plan]) -> str:
    lines = ["flowchart TD"]
    edges: list[str] = []
    statuses: set[str] = set()
    for plan in plans:
        lines.append(f'  subgraph {plan.cluster}["{_mermaid_text(plan.label)}"]')
        _mermaid_steps(plan.steps, "    ", lines, edges, statuses)
        lines.append("  end")
        if plan.parent_node is not None:
            edges.append(f"  {plan.parent_node} -.-> {plan.cluster}")
    lines += edges
    lines += [
        f"  classDef {status} fill:{_FILL.get(status, '#ffffff')},stroke:#555"
        for status in sorted(statuses)
    ]
    return "\n".join(lines) + "\n"


_DOT_SHAPES = {"map": "box3d", "loop": "hexagon", "subplan": "component"}


def _dot_steps(steps: dict[str, _Step], indent: str, lines: list[str], edges: list[str]) -> None:
    for step in steps.values():
        fill = _FILL.get(step.status, "#ffffff")
        label = _dot_text(f"{step.label}\n{step.status}")
        shape = _DOT_SHAPES.get(step.kind)
        extra = f", shape={shape}" if shape else ""
        lines.append(f'{indent}{step.node} [label="{label}", fillcolor="{fill}"{extra}];')
        said = _dot_text(_edge_label(step))
        for dep in step.depends_on:
            if dep not in steps:
                continue
            attributes = []
            if said:
                attributes.append(f'label="{said}"')
            if step.on_failure:
                attributes.append('style=dotted, color="#c62828"')
            shown = f" [{', '.join(attributes)}]" if attributes else ""
            edges.append(f"  {steps[dep].node} -> {step.node}{shown};")
        if step.until:
            said = _dot_text(f"repeat until {_short(step.until)}")
            edges.append(f'  {step.node} -> {step.node} [label="{said}"];')
        if step.body is not None and step.body.steps:
            lines.append(f"{indent}subgraph cluster_{step.body.cluster} {{")
            lines.append(f'{indent}  label="{_dot_text(step.body.label)}";')
            lines.append(f"{indent}  style=dashed;")
            _dot_steps(step.body.steps, indent + "  ", lines, edges)
            lines.append(f"{indent}}}")
            first = next(iter(step.body.steps.values())).node
            edges.append(
                f"  {step.node} -> {first} [style=dashed, lhead=cluster_{step.body.cluster}];"
            )


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
        _dot_steps(plan.steps, "    ", lines, edges)
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
