"""The CLI in an 80-column terminal: the trace waterfall, the plan tree, the agents table and the
``trace`` command fit, and still say what matters (tree, services, durations, errors, events,
endpoints)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console, RenderableType
from typer.testing import CliRunner

from stratagem.protocol import PlanSnapshot
from stratagem.runtime import SpanRecord
from stratagem.runtime._cli import _app as cli
from stratagem.runtime._cli._deploy import _agents_table
from stratagem.runtime.host._directory import AgentInfo
from stratagem.runtime.operator._history import plan_view
from stratagem.runtime.operator._render import plan_forest, span_tree

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MS = 1_000_000
ROLES = ("orchestrator", "perception", "strategic", "tactical", "critic")


def _span(
    n: int, parent: int, name: str, service: str, start: int, end: int, **more: object
) -> SpanRecord:
    return SpanRecord(
        trace_id=TRACE,
        span_id=f"{n:016x}",
        parent_id=f"{parent:016x}" if parent else "",
        name=name,
        kind=str(more.pop("kind", "INTERNAL")),
        start=start * MS,
        end=end * MS,
        status=str(more.pop("status", "UNSET")),
        service=service,
        pid=1,
        attributes=dict(more.pop("attributes", {})),  # type: ignore[call-overload]
        events=list(more.pop("events", [])),  # type: ignore[call-overload]
    )


def _rpc(kind: str, capability: str) -> dict[str, object]:
    return {
        "kind": kind,
        "attributes": {
            "rpc.system": "grpc",
            "rpc.method": "Call",
            "stratagem.capability": capability,
        },
    }


def _deep_trace() -> list[SpanRecord]:
    """A goal as deep as the demo's: client, server, plan, step, client, server, plan, tool step."""
    call = "stratagem.v1.AgentService/Call"
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "summarize_narrative"}
    retry = {"name": "retry", "time": 0, "attributes": {}}
    return [
        _span(1, 0, "goal Mira recovers the silver crown", "stratagem-cli", 0, 2000),
        _span(2, 1, call, "stratagem-cli", 1, 1999, **_rpc("CLIENT", "SubmitGoal")),
        _span(3, 2, call, "stratagem-orchestrator", 2, 1998, **_rpc("SERVER", "SubmitGoal")),
        _span(4, 3, "invoke_agent orchestrator", "stratagem-orchestrator", 3, 1997),
        _span(5, 4, "step analyze", "stratagem-orchestrator", 10, 900),
        _span(6, 5, call, "stratagem-orchestrator", 11, 899, **_rpc("CLIENT", "AnalyzeNarrative")),
        _span(7, 6, call, "stratagem-strategic", 12, 898, **_rpc("SERVER", "AnalyzeNarrative")),
        _span(8, 7, "invoke_agent strategic", "stratagem-strategic", 13, 897),
        _span(
            9,
            8,
            "step summary",
            "stratagem-strategic",
            14,
            896,
            attributes=tool,
            events=[retry] * 2,
        ),
        _span(10, 4, "step apply", "stratagem-orchestrator", 901, 1990, status="ERROR"),
    ]


def _lines(renderable: RenderableType, width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_waterfall_fits_80_columns_and_keeps_what_matters() -> None:
    lines = _lines(span_tree(_deep_trace(), width=80), 80)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert f"trace {TRACE} · 10 spans · 2000.0ms" in lines[0]
    for shown in (
        "goal Mira recovers the silver crown",
        "call SubmitGoal",
        "serve AnalyzeNarrative",
        "invoke_agent strategic",
        "orchestrator",
        "strategic",
        "2000.0ms",
        "884.0ms",
    ):
        assert shown in text, shown
    assert "stratagem-" not in text.split("\n", 1)[1]  # services named without the prefix
    # Two characters of tree guide a level, and the bar still drawn.
    [summary] = [line for line in lines if "summary" in line]
    assert summary.startswith("      │       └ summary · summar")
    assert "retry x2" in summary  # the events whole; the name gave way
    assert "█" in summary
    [apply] = [line for line in lines if "step apply" in line]
    assert apply.rstrip().endswith("✗")


@pytest.mark.parametrize("width", [60, 80, 100, 139])
def test_every_narrow_width_fits(width: int) -> None:
    assert max(map(len, _lines(span_tree(_deep_trace(), width=width), width))) <= width


def test_a_wide_terminal_keeps_every_column() -> None:
    lines = _lines(span_tree(_deep_trace(), width=200), 200)
    text = "\n".join(lines)
    assert "stratagem.v1.AgentService/Call" in text
    assert "stratagem-orchestrator" in text
    assert "step summary · tool summarize_narrative" in text
    assert "+10.0ms" in text


def _snapshot(plan_id: str, agent: str, steps: list[dict[str, object]]) -> PlanSnapshot:
    plan = {"id": plan_id, "owner": agent, "goal": "g", "steps": steps}
    return PlanSnapshot(
        plan_id=plan_id, agent=agent, revision=1, status="succeeded", plan_json=json.dumps(plan)
    )


def test_the_plan_tree_fits_80_columns() -> None:
    root = "goal-3fd8b841aa9e"
    deps = ["protagonist", "themes", "tension", "entities"]
    snapshots = [
        _snapshot(
            root,
            "orchestrator",
            [
                {
                    "kind": "cross_agent",
                    "id": "analyze",
                    "target": "strategic",
                    "capability": "AnalyzeNarrative",
                    "depends_on": ["extract"],
                    "status": "succeeded",
                }
            ],
        ),
        _snapshot(
            f"{root}/analyze",
            "strategic",
            [
                {
                    "kind": "tool",
                    "id": "summary",
                    "tool": "summarize_narrative",
                    "depends_on": deps,
                    "status": "succeeded",
                }
            ],
        ),
    ]
    lines = _lines(plan_forest([plan_view(s) for s in snapshots], root, width=80), 80)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert "strategic plan …/analyze ✓ succeeded" in text
    # A step's status is its mark alone, so its line keeps its dependencies.
    assert "✓  summary  tool summarize_narrative  after protagonist, themes," in text
    wide = "\n".join(_lines(plan_forest([plan_view(s) for s in snapshots], root, width=160), 160))
    assert "✓ succeeded  summary  tool summarize_narrative" in wide


def _info(role: str, port: int, node: str = "a" * 56) -> AgentInfo:
    return AgentInfo(
        role=role,
        endpoint=f"127.0.0.1:{port}",
        node_id=node,
        node_ip="127.0.0.1",
        pid=4_194_000 + port,
        restarted=False,
        plans_running=12,
        plans_blocked=3,
        restarts=0,
    )


@pytest.fixture
def _commands_loaded() -> None:
    """What a command binds when it runs (the agents table's rich Table among them)."""
    cli._load_runtime()


@pytest.mark.usefixtures("_commands_loaded")
def test_the_agents_table_fits_80_columns() -> None:
    infos = [_info(role, 40_000 + i) for i, role in enumerate(ROLES)]
    lines = _lines(_agents_table(infos, "local", width=80), 80)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    for info in infos:
        assert info.endpoint in text  # whole, not cut
        assert str(info.pid) in text
        assert info.role in text
    assert "aaaaaaaa" not in text  # one node: no node column


@pytest.mark.usefixtures("_commands_loaded")
def test_the_agents_table_shows_nodes_when_there_are_several() -> None:
    infos = [_info(role, 40_000 + i, node=f"{i:x}" * 56) for i, role in enumerate(ROLES)]
    lines = _lines(_agents_table(infos, "cluster", width=80), 80)
    assert max(map(len, lines)) <= 80
    assert "11111111" in "\n".join(lines)


def test_the_trace_command_fits_an_80_column_terminal(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(dataclasses.asdict(s)) + "\n" for s in _deep_trace()))
    saved = cli.console.width
    cli.console.width = 80
    try:
        result = CliRunner().invoke(cli.app, ["trace", TRACE, "--file", str(path)])
    finally:
        cli.console.width = saved
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert "serve AnalyzeNarrative" in result.stdout


def test_the_plans_table_keeps_a_sub_plans_id_on_one_line_at_80_columns() -> None:
    from datetime import UTC, datetime

    from stratagem.runtime.operator._history import HistoryPage, PlanView
    from stratagem.runtime.operator._show import history_table

    now = datetime.now(UTC)
    views = [
        PlanView(
            plan_id=f"goal-5e171763e55c/{step}",
            agent=agent,
            revision=1,
            status=status,
            created=now,
            updated=now,
            trace_id="2ef172f2" * 4,
        )
        for step, agent, status in (
            ("observe", "perception", "succeeded"),
            ("beat_1", "tactical", "failed"),
        )
    ]
    narrow = Console(width=80, record=True, color_system=None)
    narrow.print(history_table(HistoryPage(plans=views), 80))
    lines = narrow.export_text().splitlines()
    # Two plans, two lines (the id never folds); a status is its mark alone.
    assert len(lines) == 3
    assert "goal-5e171763e55c/observe" in lines[1]
    assert "✓" in lines[1]
    assert "✗" in lines[2]
    assert "succeeded" not in lines[1]
    wide = Console(width=140, record=True, color_system=None)
    wide.print(history_table(HistoryPage(plans=views), 140))
    assert "✗ failed" in wide.export_text()


@pytest.mark.usefixtures("_commands_loaded")
def test_the_agents_table_shows_each_roles_model_when_one_plans_with_a_model() -> None:
    infos = [_info(role, 40_000 + i) for i, role in enumerate(ROLES)]
    text = "\n".join(_lines(_agents_table(infos, "local", width=80), 80))
    assert "model" not in text  # every agent plans by its rules: no model column
    tiers = {"perception": "tiny (weak)", "orchestrator": "big (strong)"}
    infos = [dataclasses.replace(info, model=tiers.get(info.role, "")) for info in infos]
    lines = _lines(_agents_table(infos, "local", width=99), 99)
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ROLES}
    assert "tiny (weak)" in rows["perception"]
    assert "big (strong)" in rows["orchestrator"]
    assert rows["tactical"].rstrip().endswith("rules")
    assert max(map(len, _lines(_agents_table(infos, "local", width=80), 80))) <= 80
