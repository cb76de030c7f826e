"""``demo`` and ``submit``: a goal pursued across all agents of the running deployment (or, when
asked, of an embedded one of the command's own), shown live, with its trace and audit head."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape

from stratagem.runtime._cli._app import (
    AddressOpt,
    EmbeddedOpt,
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
    _running,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
)
from stratagem.runtime._cli._ask import run_ask
from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.operator._input import (
    InputError,
    check_goal_timeout,
    read_mapping,
    validation_line,
)

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.live import Live
    from rich.table import Table

    from stratagem.agents import DEMO_GOAL
    from stratagem.protocol import (
        DeadlineExceededError,
        ProtocolError,
        RemoteError,
        SubmitGoalRequest,
        UnavailableError,
    )
    from stratagem.runtime.config._settings import Settings
    from stratagem.runtime.host._launcher import Deployment
    from stratagem.runtime.host._local import LocalCluster
    from stratagem.runtime.operator._ask import ask_request, goal_file_asks
    from stratagem.runtime.operator._goal import GoalOutcome, new_goal_id
    from stratagem.runtime.operator._history import PlanHistory
    from stratagem.runtime.operator._render import (
        Progress,
        action_text,
        plan_forest,
        relation_text,
        span_tree,
    )
    from stratagem.runtime.telemetry._backend import find_backend
    from stratagem.runtime.telemetry._telemetry import (
        read_spans,
        setup_telemetry,
        shutdown_telemetry,
    )

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
    request: SubmitGoalRequest,
    settings: Settings,
    *,
    as_json: bool,
    timeout: float | None,
    embedded: bool | None,
) -> None:
    """Pursue ``request``: on the running deployment (never changed: a missing agent is named and
    nothing runs), or, with ``embedded`` (``None``: only when no deployment runs), on agents of
    this command's own on an embedded Ray, removed after."""
    started = time.monotonic()
    request = request.model_copy(update={"plan_id": request.plan_id or new_goal_id()})
    settings, trace_file = _traced(settings, as_json=as_json)
    # Without --timeout the goal's deadline follows the deployment's planners (Operator.submit:
    # model planners get longer); finding the agents is bounded by the request timeout.
    limit = timeout or settings.request_timeout_s
    deployment = _deployment(settings)
    progress = Progress()
    with _errors():
        _ = deployment.roles  # an extension that does not load stops here, before Ray
        if embedded is None:
            embedded = _nothing_runs(settings)
        if not as_json:
            err_console.print(
                "[dim]starting agents of this command's own…[/]"
                if embedded
                else "[dim]finding the deployment's agents…[/]"
            )
        with contextlib.ExitStack() as stack:
            if embedded:
                dep = stack.enter_context(deployment.embedded())
            else:
                dep = stack.enter_context(_running(deployment, embedded_hint=True))
            endpoints = _find_agents(dep, started=started, limit=limit, as_json=as_json)
            # The goal's deadline counts from the command's start: finding the agents included.
            remaining: float | None = None
            if timeout is not None:
                remaining = timeout if embedded else timeout - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                raise DeadlineExceededError(
                    f"the command did not finish within {limit:g} s (finding the agents took "
                    "it all): raise --timeout"
                )
            try:
                outcome = _pursue(
                    settings, request, endpoints, remaining, progress, as_json=as_json
                )
            except RemoteError as exc:
                dep.flush_telemetry()
                _fail_goal(exc, settings, request.plan_id, endpoints, as_json=as_json)
            dep.flush_telemetry()
        shutdown_telemetry("stratagem-cli")
        _show_goal(outcome, settings, trace_file, as_json=as_json)


def _traced(settings: Settings, *, as_json: bool) -> tuple[Settings, Path]:
    """``settings`` with their trace file (by default ``spans.jsonl`` in the state directory),
    which this process's spans go to too, and that file."""
    trace_file = settings.trace_file or settings.state_dir / "spans.jsonl"
    settings = settings.model_copy(update={"trace_file": trace_file})
    os.environ.setdefault("STRATAGEM_TRACE_FILE", str(trace_file))
    # `make otel-backend`'s Phoenix, when it runs and no OTLP endpoint is configured: every
    # process finds it through the state directory (runtime.telemetry._export).
    backend = find_backend(settings.state_dir)
    if backend is not None and not as_json:
        err_console.print(f"[dim]exporting spans to {backend.kind} at {backend.url}[/]")
    setup_telemetry("stratagem-cli", trace_file=trace_file, state_dir=settings.state_dir)
    return settings, trace_file


def _find_agents(dep: Deployment, *, started: float, limit: float, as_json: bool) -> dict[str, str]:
    """The serving agents' endpoints by role (named on standard error unless ``as_json``); the
    command's deadline (``limit`` seconds from ``started``) passing meanwhile is said as such."""
    try:
        endpoints = dep.serving_endpoints(timeout_s=min(10.0, limit))
    except UnavailableError as exc:
        if time.monotonic() - started < limit:
            raise  # agents that did not answer within the time they were given
        raise DeadlineExceededError(
            f"the command's deadline ({limit:g} s) passed while finding the agents "
            f"({exc.message}): raise --timeout"
        ) from exc
    if not as_json:
        err_console.print(
            f"[dim]{dep.mode} Ray · agents: "
            + ", ".join(f"{r}@{e}" for r, e in endpoints.items())
            + "[/]"
        )
    return endpoints


def _pursue(
    settings: Settings,
    request: SubmitGoalRequest,
    endpoints: dict[str, str],
    remaining: float | None,
    progress: Progress,
    *,
    as_json: bool,
) -> GoalOutcome:
    """Submit the goal to ``endpoints`` within ``remaining`` seconds (``None``: its own deadline),
    its ``progress`` shown live on a terminal (not with ``as_json``)."""
    if as_json or not console.is_terminal:
        return _operate(
            settings,
            lambda op: op.submit(request),
            timeout=remaining,
            endpoints=endpoints,
            bounded=remaining is not None,
        )
    with Live(progress.render(), console=console, refresh_per_second=8) as live:

        def on_event(event: Any) -> None:
            progress.add(event)
            live.update(progress.render())

        return _operate(
            settings,
            lambda op: op.submit(request, on_event=on_event),
            timeout=remaining,
            endpoints=endpoints,
            bounded=remaining is not None,
        )


def _fail_goal(
    exc: RemoteError,
    settings: Settings,
    plan_id: str,
    endpoints: dict[str, str],
    *,
    as_json: bool,
) -> NoReturn:
    """Fail with ``exc``, naming where the goal went wrong when its history says."""
    failed = _failure_of(settings, plan_id, endpoints)
    _fail_traced(
        exc,
        as_json=as_json,
        plan_id=plan_id,
        failure=failed.failure if failed else "",
        failed_at=failed.failed_at if failed else "",
        cause=failed.cause if failed else "",
    )


def _show_goal(
    outcome: GoalOutcome, settings: Settings, trace_file: Path, *, as_json: bool
) -> None:
    """Print the goal's outcome with its spans and the audit chain's head (``--json``: as one
    object)."""
    head = _audit_head(settings)
    spans = read_spans(trace_file, outcome.trace_id)
    if as_json:
        _print_json(
            {
                "plan_id": outcome.plan_id,
                "status": outcome.response.status,
                "world": outcome.response.world,
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


def _nothing_runs(settings: Settings) -> bool:
    """Whether no deployment runs for these settings (no address, no live local head)."""
    if settings.address is not None:
        return False
    recorded = LocalCluster.recorded(settings.local_cluster_file)
    return recorded is None or not recorded.alive


def _failure_of(settings: Settings, plan_id: str, endpoints: dict[str, str]) -> PlanHistory | None:
    """The failed goal's history, which names where it went wrong (``None`` when it cannot be
    read: the error says enough)."""
    try:
        history = _operate(settings, lambda op: op.plan(plan_id), endpoints=endpoints)
    except (StratagemRuntimeError, ProtocolError):
        return None
    return history if history.failure else None


def _print_outcome(outcome: GoalOutcome, spans: list[Any], head: dict[str, Any]) -> None:
    resp = outcome.response
    console.rule(f"[bold]goal {outcome.plan_id}: {resp.status.replace('_', ' ')}")
    if resp.note:
        console.print(f"[bold yellow]{resp.status.replace('_', ' ')}:[/] {resp.note}")
    console.print(plan_forest(outcome.plans, outcome.plan_id, width=console.width))
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
    if resp.consultations:
        console.print(_consultations(resp.consultations, console.width))
    services = sorted({s.service for s in spans})
    console.print(
        f"[bold]trace[/] {outcome.trace_id} · {len(spans)} spans from {len(services)} services"
    )
    console.print(span_tree(spans, width=console.width))
    console.print(
        f"[bold]audit[/] {head['records']} records · chain "
        + ("[green]verified[/]" if head["ok"] else "[red]BROKEN[/]")
        + f" · head {head['head'][:16]}"
    )
    console.print(
        f"[bold]world[/] {resp.world} ('stratagem world show {resp.world}')", highlight=False
    )


def _consultations(consultations: list[Any], width: int) -> Table:
    """What each external agent the goal consulted answered (its text, else its JSON part, cut
    to a few lines), or why it did not."""
    table = Table(title="Consultations (external A2A agents)", title_justify="left")
    table.add_column("agent")
    table.add_column("status")
    table.add_column("answer", overflow="fold")
    room = max(200, width * 4)
    for item in consultations:
        if item.status == "answered":
            said = item.text or item.data_json or f"(task {item.task_id} {item.state})"
        else:
            said = item.error or "(not asked: the goal stopped first)"
        cut = said if len(said) <= room else said[: room - 1] + "…"
        colour = "green" if item.status == "answered" else "yellow"
        table.add_row(item.agent, f"[{colour}]{item.status}[/]", escape(cut))
    return table


WorldOpt = Annotated[
    str | None,
    typer.Option(
        "--world",
        help="The world the goal reads and changes (else the goal file's 'world:', else a fresh "
        "one named after the goal's plan id); see 'stratagem world list'.",
    ),
]


def _in_world(request: SubmitGoalRequest, world: str | None) -> SubmitGoalRequest:
    if world is None:
        return request
    try:
        return SubmitGoalRequest.model_validate({**request.model_dump(), "world": world})
    except ValidationError as exc:
        raise InputError(validation_line("--world", exc)) from exc


@app.command()
def demo(
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    planner: PlannerOpt = None,
    world: WorldOpt = None,
) -> None:
    """Pursue the built-in story goal: on the running deployment, else on agents of its own on
    an embedded Ray (started and removed here).

    Examples:

      stratagem demo

      stratagem demo --json | jq -r .trace_id
    """
    _load_agents()  # binds DEMO_GOAL
    with _errors():
        check_goal_timeout(timeout)
        settings = _settings(address, state_dir, **({"planner": planner} if planner else {}))
        request = _in_world(DEMO_GOAL, world)
    _execute_goal(request, settings, as_json=as_json, timeout=timeout, embedded=None)


@app.command()
def submit(
    goal_file: Annotated[
        Path, typer.Argument(help="YAML file with goal, passage, beats and world (optional).")
    ],
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
    world: WorldOpt = None,
    embedded: EmbeddedOpt = False,
) -> None:
    """Pursue the goal in GOAL_FILE across the running deployment's agents, in its world (the
    deployment is not changed: a missing agent is named and nothing runs); --embedded runs it on
    agents of its own. On failure, name where it went wrong and its trace id (standard error,
    and standard output with --json).

    A goal file holds goal, passage, beats (1-8, default 3), and optionally world, plan_id and
    consult (external A2A agents to ask, from STRATAGEM_A2A_AGENTS; docs/goals.md). A file
    without a passage is a goal in plain words, as 'stratagem ask' takes: goal, and optionally
    inputs, plan_only, approve and plan_id.

    Examples:

      stratagem submit examples/lighthouse.yaml

      stratagem submit examples/lighthouse.yaml --world lab --json

      stratagem submit examples/lighthouse.yaml --detach
    """
    with _errors():
        check_goal_timeout(timeout)  # before the seconds spent finding the agents
        raw = read_mapping(goal_file, "goal, passage and beats")
        if goal_file_asks(raw):  # no passage: a goal in plain words (runtime/_cli/_ask.py)
            asked = ask_request(raw)
            settings = _settings(address, state_dir)
    if goal_file_asks(raw):
        run_ask(asked, settings, as_json=as_json, timeout=timeout)
        return
    with _errors():
        request = _in_world(_load_goal(goal_file), world)
        settings = _settings(address, state_dir, **({"planner": planner} if planner else {}))
        if detach and embedded:
            raise InputError(
                "--detach leaves the goal running on the deployment, --embedded removes its "
                "agents when the command ends: use one of them"
            )
    if detach:
        _start_goal(request, settings, as_json=as_json, timeout=timeout)
        return
    _execute_goal(request, settings, as_json=as_json, timeout=timeout, embedded=embedded)
