"""The plan commands: ``plans run|show|list|watch``, ``replay`` and the control verbs (``approve``,
``reject``, ``pause``, ``cancel``, ``resume``, ``replan``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _check_role,
    _client,
    _deployed_endpoints,
    _deployment,
    _errors,
    _load_agents,
    _owner_of,
    _print_json,
    _print_json_line,
    _read_mapping,
    _run,
    _running,
    _settings,
    _unknown,
    _validation_line,
    _with_agent,
    app,
    console,
    lazy_scope,
    plans_app,
)
from stratagem.runtime._input import (
    InputError,
    check_encoded_size,
    check_plan_steps,
    parse_json_object,
)

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.table import Table

    from stratagem.agents import ExtensionError, build_agent
    from stratagem.planning import PlanStatus, PlanValidationError, validate_plan
    from stratagem.protocol import (
        CAPABILITIES,
        OPERATOR,
        ROLES,
        ClientConfig,
        ControlAction,
        ControlRequest,
        PlanSnapshot,
        ReplayResult,
        RevisionsResponse,
    )
    from stratagem.runtime._diagram import DIAGRAM_FORMATS, plan_diagram
    from stratagem.runtime._render import plan_forest
    from stratagem.runtime._settings import Settings

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


# -- plans ---------------------------------------------------------------------------------------


def _load_plan(path: Path, settings: Settings, *, plan_id: str = "") -> tuple[str, str]:
    """Read a plan file and check it the way its owner will: returns (owner, plan JSON).

    ``plan_id``, when given, replaces the file's id (a new revision of that plan).
    """
    raw = _read_mapping(path, "a plan's id, owner and steps")
    check_plan_steps(path, raw)
    if plan_id:
        raw["id"] = plan_id
    owner = raw.get("owner")
    if owner not in ROLES:
        raise InputError(f"{path}: owner must be one of {', '.join(ROLES)}, not {owner!r}")
    _load_agents()
    try:
        agent = build_agent(owner, extensions=settings.extensions)
    except ExtensionError as exc:
        raise InputError(str(exc)) from exc
    try:
        plan = agent.plan_type.model_validate(raw)
    except ValidationError as exc:
        raise InputError(_validation_line(f"plan in {path}", exc)) from exc
    try:
        validate_plan(plan, tools=agent.registry, roles=ROLES, capabilities=CAPABILITIES)
    except PlanValidationError as exc:
        raise InputError(f"plan {plan.id!r} refused: " + "; ".join(exc.problems)) from exc
    plan_json = plan.model_dump_json()
    check_encoded_size(path, plan_json, settings.max_message_bytes)
    return owner, plan_json


@plans_app.command("run")
def plans_run(
    plan_file: Annotated[Path, typer.Argument(help="YAML or JSON plan with id, owner and steps.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Have the plan's owner validate and run a plan you wrote."""
    with _errors():
        settings = _settings(address, state_dir)
        owner, plan_json = _load_plan(plan_file, settings)
        snapshot = _with_agent(
            settings, owner, OPERATOR, timeout, lambda client: client.run_plan(plan_json)
        )
        if as_json:
            _print_json(json.loads(snapshot.model_dump_json()))
        else:
            console.print(plan_forest([snapshot], snapshot.plan_id))


@plans_app.command("show")
def plans_show(
    plan_id: Annotated[str, typer.Argument(help="A plan id, e.g. the goal id demo printed.")],
    revisions: Annotated[
        bool,
        typer.Option("--revisions", help="Print the plan's revision history from its owner."),
    ] = False,
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="A picture of the DAG with step statuses: mermaid or dot."),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a plan and every sub-plan it caused, from a running deployment."""
    with _errors():
        if fmt is not None and fmt not in DIAGRAM_FORMATS:
            raise InputError(_unknown("format", fmt, DIAGRAM_FORMATS))
        settings = _settings(address, state_dir)
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        if revisions:
            _show_revisions(plan_id, endpoints, settings, as_json=as_json)
            return

        async def collect() -> list[PlanSnapshot]:
            found: list[PlanSnapshot] = []
            for endpoint in endpoints.values():
                async with _client(settings, endpoint) as client:
                    found.extend(await client.plans(plan_id))
            return found

        snapshots = _run(collect)
        if not snapshots:
            raise InputError(f"no plan {plan_id!r} on any agent")
        if fmt is not None:
            console.file.write(plan_diagram(snapshots, plan_id, fmt))
        elif as_json:
            _print_json([json.loads(s.model_dump_json()) for s in snapshots])
        else:
            console.print(plan_forest(snapshots, plan_id))


@plans_app.command("list")
def plans_list(
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's plans (a role).")
    ] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only plans in this status, e.g. blocked.")
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the plans the agents hold: id, agent, revision, status."""
    with _errors():
        if agent is not None:
            _check_role(agent)
        _load_agents()
        statuses = [value.value for value in PlanStatus]
        if status is not None and status not in statuses:
            raise InputError(_unknown("status", status, statuses))
        settings = _settings(address, state_dir)
        endpoints = _deployed_endpoints(settings)
        roles = [agent] if agent is not None else list(endpoints)

        async def collect() -> list[PlanSnapshot]:
            found: list[PlanSnapshot] = []
            for role in roles:
                async with _client(settings, endpoints[role]) as client:
                    found.extend(await client.plans(""))
            return found

        snapshots = [s for s in _run(collect) if status is None or s.status == status]
        snapshots.sort(key=lambda s: (s.agent, s.plan_id))
        if as_json:
            _print_json(
                [
                    {"plan_id": s.plan_id, "agent": s.agent, "revision": s.revision}
                    | {"status": s.status}
                    for s in snapshots
                ]
            )
            return
        table = Table(box=None, pad_edge=False)
        for column in ("plan", "agent", "rev", "status"):
            table.add_column(column)
        for snap in snapshots:
            table.add_row(snap.plan_id, snap.agent, str(snap.revision), snap.status)
        console.print(table)
        console.print(f"{len(snapshots)} plans", highlight=False)


@plans_app.command("watch")
def plans_watch(
    plan_id: Annotated[str, typer.Argument(help="The plan to follow.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
) -> None:
    """Follow a plan's events (and its sub-plans') as they happen, until the plan ends."""
    with _errors():
        settings = _settings(address, state_dir)
        endpoints = _deployed_endpoints(settings)
        config = ClientConfig(default_timeout_s=settings.request_timeout_s)

        async def follow() -> int:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            seen = 0
            async with _client(settings, endpoints[owner]) as client:
                async for event in client.watch(plan_id):
                    seen += 1
                    if as_json:
                        _print_json_line(json.loads(event.model_dump_json()))
                    else:
                        step = f" step {event.step_id}" if event.step_id else ""
                        why = f" ({event.failure_class}: {event.message})" if event.message else ""
                        console.print(
                            f"{event.agent or owner} {event.plan_id}{step} -> "
                            f"[bold]{event.status}[/]{escape(why)}",
                            highlight=False,
                        )
            return seen

        seen = _run(follow)
        if not as_json:
            console.print(f"[dim]the plan ended; {seen} events[/]", highlight=False)


def _show_revisions(
    plan_id: str, endpoints: dict[str, str], settings: Settings, *, as_json: bool
) -> None:
    config = ClientConfig(default_timeout_s=settings.request_timeout_s)

    async def fetch() -> RevisionsResponse:
        owner = await _owner_of(plan_id, endpoints, settings, config)
        async with _client(settings, endpoints[owner], config=config) as client:
            return await client.revisions(plan_id)

    history = _run(fetch)
    if as_json:
        _print_json(history.model_dump(mode="json"))
        return
    table = Table(title=f"Revisions of plan {plan_id} on {history.agent}", title_justify="left")
    for column in ("revision", "parent", "author", "rationale", "added", "removed", "changed"):
        table.add_column(column)
    for entry in history.revisions:
        table.add_row(
            str(entry.revision),
            str(entry.parent) if entry.parent else "-",
            entry.author or "-",
            entry.rationale or "-",
            ", ".join(entry.added) or "-",
            ", ".join(entry.removed) or "-",
            ", ".join(f"{c.step_id} ({', '.join(c.fields)})" for c in entry.changed) or "-",
        )
    console.print(table)


@app.command()
def replay(
    plan_id: Annotated[str, typer.Argument(help="A finished plan's id.")],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Re-run a finished plan on its owner from its recorded outputs (no side effects) and report
    where decisions diverge; exit 1 when any does."""
    with _errors():
        settings = _settings(address, state_dir)
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def send() -> ReplayResult:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            async with _client(settings, endpoints[owner], config=config) as client:
                return await client.replay(plan_id)

        result = _run(send)
        if as_json:
            _print_json({**result.model_dump(mode="json"), "diverged": result.diverged})
        elif not result.diverged:
            console.print(
                f"no divergence: {result.decisions} decisions re-derived "
                f"(plan {result.plan_id} revision {result.revision} on {result.agent}, "
                f"{result.recorded_status})",
                highlight=False,
            )
        else:
            table = Table(
                title=f"Replay of plan {result.plan_id} revision {result.revision}: "
                f"{len(result.divergences)} of {result.decisions} decisions diverged",
                title_justify="left",
            )
            for column in ("step", "decision", "recorded", "replayed"):
                table.add_column(column)
            for d in result.divergences:
                table.add_row(d.step_id or "(plan)", d.decision, d.recorded, d.replayed)
            console.print(table)
    if result.diverged:
        raise typer.Exit(1)


# -- control -------------------------------------------------------------------------------------

PlanArg = Annotated[str, typer.Argument(help="The plan's id (stratagem plans show lists plans).")]
GateArg = Annotated[
    str, typer.Argument(help="The gate step's id, or the step a reconcile gate names.")
]
RationaleOpt = Annotated[
    str, typer.Option("--rationale", help="Why (recorded in the audit log, redacted).")
]


def _control(
    plan_id: str,
    action: ControlAction,
    *,
    address: str | None,
    state_dir: Path | None,
    as_json: bool,
    timeout: float | None,
    gate_id: str = "",
    rationale: str = "",
    output: str | None = None,
    plan_file: Path | None = None,
) -> None:
    """Send one control action to the agent that owns ``plan_id`` and print the plan's state."""
    with _errors():
        settings = _settings(address, state_dir)
        plan_json = ""
        if plan_file is not None:
            _, plan_json = _load_plan(plan_file, settings, plan_id=plan_id)
        recorded: dict[str, Any] | None = None
        if output is not None:
            recorded = parse_json_object(output, "--output")
        try:
            ControlRequest(
                plan_id=plan_id,
                action=action,
                gate_id=gate_id,
                rationale=rationale,
                output_json="" if recorded is None else json.dumps(recorded),
                plan_json=plan_json,
            )
        except ValidationError as exc:
            raise InputError(_validation_line(f"{action} of plan {plan_id!r}", exc)) from exc
        with _running(_deployment(settings)) as deployment:
            endpoints = {info.role: info.endpoint for info in deployment.status()}
        config = ClientConfig(default_timeout_s=timeout or settings.request_timeout_s)

        async def send() -> PlanSnapshot:
            owner = await _owner_of(plan_id, endpoints, settings, config)
            async with _client(settings, endpoints[owner], config=config) as client:
                return await client.control(
                    plan_id,
                    action,
                    gate_id=gate_id,
                    rationale=rationale,
                    output=recorded,
                    plan_json=plan_json,
                )

        snapshot = _run(send)
        if as_json:
            _print_json(json.loads(snapshot.model_dump_json()))
        else:
            gate = f" gate {gate_id}" if gate_id else ""
            console.print(
                f"{action}{gate}: plan {snapshot.plan_id} revision {snapshot.revision} on "
                f"{snapshot.agent} is [bold]{snapshot.status}[/]",
                highlight=False,
            )


@app.command()
def approve(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="For a reconcile gate: the step's output (a JSON object) to record instead of "
            "re-running it, when you found its effect done.",
        ),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Approve a gate: its plan goes on (a reconciled step is re-run, or recorded with --output)."""
    _control(
        plan_id,
        "approve",
        gate_id=gate_id,
        rationale=rationale,
        output=output,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )


@app.command()
def reject(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Reject a gate: the gate (or reconciled step) fails, and so its plan, which is compensated."""
    _control(
        plan_id,
        "reject",
        gate_id=gate_id,
        rationale=rationale,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )


@app.command()
def pause(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Pause a plan: no new step starts, running ones finish; 'resume' continues it."""
    _control(
        plan_id, "pause", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def cancel(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Cancel a plan for good: running steps are cancelled, completed ones compensated."""
    _control(
        plan_id, "cancel", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def resume(
    plan_id: PlanArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Resume a stored, unfinished plan that is not running (paused, or left by a stop)."""
    _control(
        plan_id, "resume", address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
    )


@app.command()
def replan(
    plan_id: PlanArg,
    plan_file: Annotated[
        Path, typer.Argument(help="YAML or JSON plan: the new revision's owner and steps.")
    ],
    rationale: Annotated[
        str, typer.Option("--rationale", help="Why the plan changes (kept with the revision).")
    ],
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Make a new revision of a stored plan that is not running (pause it first); 'resume' runs
    it, with the results of unchanged completed steps carried over."""
    _control(
        plan_id,
        "replan",
        rationale=rationale,
        plan_file=plan_file,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
    )
