"""``demo`` and ``submit``: a goal pursued across all agents on an embedded (or running)
deployment, shown live, with its trace and audit head."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    PlannerOpt,
    StateDirOpt,
    TimeoutOpt,
    _audit_head,
    _deployment,
    _errors,
    _fail_traced,
    _load_agents,
    _operate,
    _print_json,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
)
from stratagem.runtime._input import InputError, read_mapping, validation_line

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.live import Live
    from rich.table import Table

    from stratagem.agents import DEMO_GOAL
    from stratagem.protocol import ProtocolError, RemoteError, SubmitGoalRequest
    from stratagem.runtime._backend import use_backend
    from stratagem.runtime._goal import GoalOutcome, new_goal_id
    from stratagem.runtime._local import LaunchError
    from stratagem.runtime._render import (
        Progress,
        action_text,
        plan_forest,
        relation_text,
        span_tree,
    )
    from stratagem.runtime._settings import Settings
    from stratagem.runtime._telemetry import read_spans, setup_telemetry, shutdown_telemetry

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


def _load_goal(path: Path) -> SubmitGoalRequest:
    raw = read_mapping(path, "goal, passage and beats")
    try:
        return SubmitGoalRequest.model_validate(raw)
    except ValidationError as exc:
        raise InputError(validation_line(f"goal file {path}", exc)) from exc


def _start_goal(
    request: SubmitGoalRequest, settings: Settings, *, as_json: bool, timeout: float | None
) -> None:
    """Start the goal on the running deployment and print its plan and trace ids at once."""
    with _errors():
        request = request.model_copy(update={"plan_id": request.plan_id or new_goal_id()})
        try:
            started = _operate(settings, lambda op: op.start(request), timeout=timeout)
        except RemoteError as exc:
            _fail_traced(exc, as_json=as_json, plan_id=request.plan_id)
        if as_json:
            _print_json(
                {
                    "plan_id": started.plan_id,
                    "trace_id": started.trace_id,
                    "status": started.status,
                }
            )
            return
        console.print(
            f"goal {started.plan_id} {started.status} · trace {started.trace_id}\n"
            f"  stratagem plans watch {started.plan_id}\n"
            f"  stratagem plans show {started.plan_id}",
            highlight=False,
            soft_wrap=True,
        )


def _execute_goal(
    request: SubmitGoalRequest, settings: Settings, *, as_json: bool, timeout: float | None
) -> None:
    request = request.model_copy(update={"plan_id": request.plan_id or new_goal_id()})
    trace_file = settings.trace_file or settings.state_dir / "spans.jsonl"
    settings = settings.model_copy(update={"trace_file": trace_file})
    os.environ.setdefault("STRATAGEM_TRACE_FILE", str(trace_file))
    # `make otel-backend`'s Phoenix, when it runs and no OTLP endpoint is configured.
    backend = use_backend(settings.state_dir)
    if backend is not None and not as_json:
        err_console.print(f"[dim]exporting spans to {backend.kind} at {backend.url}[/]")
    provider = setup_telemetry("stratagem-cli", trace_file=trace_file)
    if timeout is None and settings.plans_with_a_model:
        # A goal waits on several model calls (tens of seconds each on a CPU): a longer default.
        timeout = max(settings.request_timeout_s, 3 * settings.effective_step_timeout_s)
    deployment = _deployment(settings)
    progress = Progress()
    with _errors():
        if not as_json:
            err_console.print("[dim]starting agents…[/]")
        with deployment.embedded() as dep:
            endpoints = {info.role: info.endpoint for info in dep.status()}
            if not as_json:
                err_console.print(
                    f"[dim]{dep.mode} Ray · agents: "
                    + ", ".join(f"{r}@{e}" for r, e in endpoints.items())
                    + "[/]"
                )
            try:
                if as_json or not console.is_terminal:
                    outcome = _operate(
                        settings,
                        lambda op: op.submit(request),
                        timeout=timeout,
                        endpoints=endpoints,
                    )
                else:
                    with Live(progress.render(), console=console, refresh_per_second=8) as live:

                        def on_event(event: Any) -> None:
                            progress.add(event)
                            live.update(progress.render())

                        outcome = _operate(
                            settings,
                            lambda op: op.submit(request, on_event=on_event),
                            timeout=timeout,
                            endpoints=endpoints,
                        )
            except RemoteError as exc:
                dep.flush_telemetry()
                provider.force_flush()
                _fail_traced(
                    exc,
                    as_json=as_json,
                    plan_id=request.plan_id,
                    failure=_failure_of(settings, request.plan_id, endpoints),
                )
            dep.flush_telemetry()
        provider.force_flush()
        shutdown_telemetry("stratagem-cli")
        head = _audit_head(settings)
        spans = read_spans(trace_file, outcome.trace_id)
        if as_json:
            _print_json(
                {
                    "plan_id": outcome.plan_id,
                    "trace_id": outcome.trace_id,
                    "response": outcome.response.model_dump(mode="json"),
                    "plans": [json.loads(p.model_dump_json()) for p in outcome.plans],
                    "spans": len(spans),
                    "services": sorted({s.service for s in spans}),
                    "audit": head,
                }
            )
            return
        _print_outcome(outcome, spans, head)


def _failure_of(settings: Settings, plan_id: str, endpoints: dict[str, str]) -> str:
    """The line naming where a failed goal went wrong, from the agents' histories ("" when it
    cannot be read: the error says enough)."""
    try:
        history = _operate(settings, lambda op: op.plan(plan_id), endpoints=endpoints)
    except (InputError, ProtocolError, LaunchError):
        return ""
    return history.failure


def _print_outcome(outcome: GoalOutcome, spans: list[Any], head: dict[str, Any]) -> None:
    resp = outcome.response
    console.rule(f"[bold]goal {outcome.plan_id}: {resp.status}")
    console.print(plan_forest(outcome.plans, outcome.plan_id))
    beats = Table(title="Arc", title_justify="left")
    beats.add_column("beat")
    beats.add_column("title")
    beats.add_column("reached when")
    for beat in resp.beats:
        beats.add_row(beat.id, beat.title, ", ".join(relation_text(g) for g in beat.goals))
    console.print(beats)
    actions = Table(title="Action sequence", title_justify="left")
    actions.add_column("#", justify="right")
    actions.add_column("action")
    for i, action in enumerate(resp.actions, 1):
        actions.add_row(str(i), action_text(action))
    console.print(actions)
    changes = Table(title="World-state changes", title_justify="left")
    changes.add_column("change")
    changes.add_column("fact")
    for rel in resp.added:
        changes.add_row("[green]+ added", relation_text(rel))
    for rel in resp.removed:
        changes.add_row("[red]- removed", relation_text(rel))
    console.print(changes)
    services = sorted({s.service for s in spans})
    console.print(
        f"[bold]trace[/] {outcome.trace_id} · {len(spans)} spans from {len(services)} services"
    )
    console.print(span_tree(spans))
    console.print(
        f"[bold]audit[/] {head['records']} records · chain "
        + ("[green]verified[/]" if head["ok"] else "[red]BROKEN[/]")
        + f" · head {head['head'][:16]}"
    )


@app.command()
def demo(
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    planner: PlannerOpt = None,
) -> None:
    """Start a local Ray, launch the four agents and pursue the built-in story goal."""
    with _errors():
        settings = _settings(address, state_dir, **({"planner": planner} if planner else {}))
    _load_agents()
    _execute_goal(DEMO_GOAL, settings, as_json=as_json, timeout=timeout)


@app.command()
def submit(
    goal_file: Annotated[Path, typer.Argument(help="YAML file with goal, passage and beats.")],
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Start the goal on the running deployment and print its plan and trace ids at "
            "once; it runs on ('plans watch ID' follows it).",
        ),
    ] = False,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    planner: PlannerOpt = None,
) -> None:
    """Pursue the goal in GOAL_FILE across all agents; on failure, name where it went wrong and
    its trace id (standard error, and standard output with --json)."""
    with _errors():
        request = _load_goal(goal_file)
        settings = _settings(address, state_dir, **({"planner": planner} if planner else {}))
    if detach:
        _start_goal(request, settings, as_json=as_json, timeout=timeout)
        return
    _execute_goal(request, settings, as_json=as_json, timeout=timeout)
