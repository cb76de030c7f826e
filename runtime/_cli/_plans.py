"""The plan commands: ``plans run|show|list|watch``, and the verbs on one plan (``replay``,
``approve``, ``reject``, ``pause``, ``cancel``, ``resume``, ``replan``, ``fork``), each registered
once under ``plans`` and as a top-level alias (``stratagem plans approve`` = ``stratagem
approve``). The control verbs' help and exit codes come from their table,
``operator._control_verbs.CONTROL_VERBS``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar, cast

import typer
from rich.markup import escape

from stratagem.runtime._cli._app import (
    _OPERATOR,
    AddressOpt,
    EmbeddedOpt,
    FullOpt,
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _errors,
    _fail_traced,
    _operate,
    _print_json,
    _print_json_line,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
    plans_app,
)
from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.operator._control_verbs import CONTROL_VERBS
from stratagem.runtime.operator._input import (
    DEFAULT_HISTORY_PAGE,
    InputError,
    parse_json_object,
    parse_json_value,
    parse_moment,
    read_mapping,
    unknown_name,
)

if TYPE_CHECKING:
    from rich.table import Table

    from stratagem.protocol import (
        ControlAction,
        FailedPreconditionError,
        InvalidArgumentError,
        PlanSnapshot,
        ProtocolError,
        RemoteError,
        RevisionsResponse,
    )
    from stratagem.runtime.config._settings import Settings
    from stratagem.runtime.operator._diagram import DIAGRAM_FORMATS, plan_diagram
    from stratagem.runtime.operator._history import PlanHistory, PlanView
    from stratagem.runtime.operator._operator import Operator, check_status
    from stratagem.runtime.operator._show import (
        approve_commands,
        event_line,
        history_table,
        plan_details,
    )
    from stratagem.runtime.telemetry._telemetry import setup_telemetry, shutdown_telemetry

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())

F = TypeVar("F", bound=Callable[..., None])


def _plan_verb(name: str, help_text: str | None = None) -> Callable[[F], F]:
    """Register a command on one plan under ``plans`` and as a top-level alias."""

    def register(command: F) -> F:
        app.command(name, help=help_text)(command)
        plans_app.command(name, help=help_text)(command)
        return command

    return register


# -- plans ---------------------------------------------------------------------------------------


WAITING_AT_A_GATE: Final = 3
"""The exit status of ``plans run`` when the plan waits at a gate (``approve`` lets it go on)."""


@plans_app.command("run")
def plans_run(
    plan_file: Annotated[Path, typer.Argument(help="YAML or JSON plan with id, owner and steps.")],
    full: FullOpt = False,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
    embedded: EmbeddedOpt = False,
) -> None:
    """Have the plan's owner validate and run a plan you wrote; print what each step did and the
    trace id. Returns as soon as the plan waits at a gate, with the 'approve' command to run (exit
    3); a deadline never cancels the plan: it runs on at its owner.

    Examples:

      stratagem plans run examples/plans/who-leads.yaml

      stratagem plans run my-plan.yaml --json
    """
    with _errors():
        settings = _settings(address, state_dir)
        setup_telemetry(
            "stratagem-cli", trace_file=settings.trace_file, state_dir=settings.state_dir
        )

        async def run(op: Operator) -> tuple[PlanView, PlanHistory]:
            view = await op.run_plan(plan_file, until_blocked=True)
            return view, await op.plan(view.plan_id, full=full)

        try:
            view, history = _operate(settings, run, timeout=timeout, embedded=embedded)
        except RemoteError as exc:
            plan_id = _plan_id_in(plan_file)
            # Its agent's own embedded Ray ended with the command: nothing to ask then.
            status, failed = ("failed", None) if embedded else _outcome_of(settings, plan_id)
            _fail_traced(
                exc,
                as_json=as_json,
                plan_id=plan_id,
                failure=failed.failure if failed else "",
                failed_at=failed.failed_at if failed else "",
                cause=failed.cause if failed else "",
                status=status,
            )
        finally:
            shutdown_telemetry("stratagem-cli")
        waiting = approve_commands(history.plans[0]) if view.status == "blocked" else []
        if as_json:
            top = history.plans[0] if history.plans else view
            _print_json(top.model_dump(mode="json") | {"approve": waiting})
        else:
            console.print(plan_details(history, full=full))
            for command in waiting:
                console.print(
                    f"plan {view.plan_id} waits at a gate; to let it go on:\n  {command}",
                    highlight=False,
                    soft_wrap=True,
                )
    if waiting:
        raise typer.Exit(WAITING_AT_A_GATE)


def _outcome_of(settings: Settings, plan_id: str) -> tuple[str, PlanHistory | None]:
    """The status of a plan whose run answered an error, and its history when that names where
    it went wrong (``failure``, ``failed_at``, ``cause``), from its owner: ``running`` past the
    call's deadline (it runs on), ``failed`` when it failed (``("failed", None)`` when it cannot
    be read: a plan refused before it was stored)."""
    if not plan_id:
        return "failed", None
    try:
        history = _operate(settings, lambda op: op.plan(plan_id))
    except (StratagemRuntimeError, ProtocolError):
        return "failed", None
    top = next((plan for plan in history.plans if plan.plan_id == plan_id), None)
    return (top.status if top is not None else "failed"), (history if history.failure else None)


def _plan_id_in(plan_file: Path) -> str:
    """The id a plan file names ("" when it cannot be read: the error says why already)."""
    try:
        return str(read_mapping(plan_file, "a plan").get("id", ""))
    except InputError:
        return ""


@plans_app.command("show")
def plans_show(
    plan_id: Annotated[str, typer.Argument(help="A plan id, e.g. the goal id demo printed.")],
    full: FullOpt = False,
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
    """Show a plan and every sub-plan it caused, from the agents' stores: each step's input,
    output, error, attempts, timing, revision and author; a failed plan opens with the line
    naming where it went wrong; the trace id follows.

    Examples:

      stratagem plans show who-leads

      stratagem plans show who-leads --full --json

      stratagem plans show who-leads --format mermaid
    """
    with _errors():
        if fmt is not None and fmt not in DIAGRAM_FORMATS:
            raise InputError(unknown_name("format", fmt, DIAGRAM_FORMATS))
        settings = _settings(address, state_dir)
        if revisions:
            _show_revisions(plan_id, settings, as_json=as_json)
            return
        history = _operate(settings, lambda op: op.plan(plan_id, full=full))
        if fmt is not None:
            console.file.write(plan_diagram(history.plans, plan_id, fmt))
        elif as_json:
            _print_json(history.model_dump(mode="json"))
        else:
            console.print(plan_details(history, full=full))


@plans_app.command("list")
def plans_list(
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's plans (a role).")
    ] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only plans in this status, e.g. blocked.")
    ] = None,
    goal: Annotated[
        str | None, typer.Option("--goal", help="Only plans whose goal contains this text.")
    ] = None,
    text: Annotated[
        str | None,
        typer.Option(
            "--text", help="Only plans whose id, goal, steps, outputs or messages contain this."
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only plans created since: an ISO time or an age (2h, 7d)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Only plans created before: an ISO time or an age."),
    ] = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="Only plans of this trace (32 hex characters).")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", help="Plans per page (1 to 1000).", min=1, max=1000)
    ] = DEFAULT_HISTORY_PAGE,
    page_token: Annotated[
        str,
        typer.Option("--page-token", help="The next page: the token the previous page printed."),
    ] = "",
    every: Annotated[
        bool,
        typer.Option(
            "--all", help="Every plan, sub-plans as rows of their own (else folded under theirs)."
        ),
    ] = False,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the plans in the agents' stores, newest first, a page at a time (across restarts).

    Goals first: each top-level plan (a goal's, or one run by hand) is one row, with how many
    sub-plans it caused on the agents folded under it; --all lists every plan. A filter by
    agent, status, goal, text or trace lists every plan that matches, sub-plans included.

    Examples:

      stratagem plans list --all

      stratagem plans list --status blocked

      stratagem plans list --agent strategic --since 2h --json
    """
    with _errors():
        if status is not None:
            check_status(status)
        bounds = (
            None if since is None else parse_moment(since, "--since"),
            None if until is None else parse_moment(until, "--until"),
        )
        settings = _settings(address, state_dir)  # the agent is checked by op.history
        # A filter names what it looks for: a blocked or failed sub-plan is never folded away.
        folded = not every and not any((agent, status, goal, text, trace))
        page = _operate(
            settings,
            lambda op: op.history(
                agent=agent,
                status=status,
                goal=goal,
                text=text,
                since=bounds[0],
                until=bounds[1],
                trace_id=trace,
                page_size=limit,
                page_token=page_token,
                top_level=folded,
            ),
        )
        if as_json:
            _print_json(page.model_dump(mode="json"))
            return
        console.print(history_table(page, console.width))
        more = f"; next page: --page-token {page.next_page_token}" if page.next_page_token else ""
        subs = sum(page.sub_plans.values())
        what = f"{len(page.plans)} plans"
        if folded:
            what += f" and {subs} sub-plans (--all lists them)" if subs else " (no sub-plans)"
        console.print(f"{what}{more}", highlight=False, soft_wrap=True)
        for line in page.unreadable:
            err_console.print(f"[yellow]not read:[/] {escape(line)}", highlight=False)


@plans_app.command("watch")
def plans_watch(
    plan_id: Annotated[str, typer.Argument(help="The plan to follow.")],
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            help="Seconds to wait for a plan no agent holds yet (one about to be submitted).",
            min=0,
            max=3600,
        ),
    ] = 0.0,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
) -> None:
    """Follow a plan's events and its sub-plans' on every agent as they happen (a finished
    plan's are replayed from the stores), until the plan ends."""
    with _errors():
        settings = _settings(address, state_dir)

        async def follow(op: Operator) -> tuple[int, str]:
            seen, final = 0, ""
            async for event in op.watch(plan_id, wait_s=wait):
                seen += 1
                if event.plan_id == plan_id and not event.step_id:
                    final = event.status
                if as_json:
                    _print_json_line(json.loads(event.model_dump_json()))
                else:
                    console.print(event_line(event), highlight=False, soft_wrap=True)
            return seen, final

        seen, final = _operate(settings, follow, bounded=False)
        if not as_json:
            console.print(f"[dim]the plan ended {final}; {seen} events[/]", highlight=False)


def _show_revisions(plan_id: str, settings: Settings, *, as_json: bool) -> None:
    history: RevisionsResponse = _operate(settings, lambda op: op.revisions(plan_id))
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


# -- verbs on one plan ---------------------------------------------------------------------------


@_plan_verb("replay")
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
        result = _operate(settings, lambda op: op.replay(plan_id), timeout=timeout)
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


PlanArg = Annotated[str, typer.Argument(help="The plan's id ('stratagem plans list' lists them).")]
GateArg = Annotated[
    str, typer.Argument(help="The gate step's id, or the step a reconcile gate names.")
]
RationaleOpt = Annotated[
    str, typer.Option("--rationale", help="Why (recorded in the audit log, redacted).")
]
AsOpt = Annotated[
    str,
    typer.Option(
        "--as",
        help="Decide as this identity (a gate may name who decides; others are refused).",
    ),
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
    caller: str = _OPERATOR,
    more: dict[str, Any] | None = None,
) -> None:
    """Send one control action to the agent that owns ``plan_id`` and print the plan's state
    (for ``fork``, the new plan's). For the decisions and ``fork``, what the agent refuses as
    bad input (a value or arguments that do not fit, a closed gate, no such fork point) is
    one line and exit 2, like input refused here."""
    with _errors():
        settings = _settings(address, state_dir)
        recorded: dict[str, Any] | None = None
        if output is not None:
            recorded = parse_json_object(output, "--output")
        try:
            snapshot: PlanSnapshot = _operate(
                settings,
                lambda op: op.control(
                    plan_id,
                    action,
                    gate_id=gate_id,
                    rationale=rationale,
                    output=recorded,
                    plan=plan_file,
                    **(more or {}),
                ),
                timeout=timeout,
                caller=caller,
            )
        except (InvalidArgumentError, FailedPreconditionError) as exc:
            if not CONTROL_VERBS[action].refusal_is_input:
                raise
            raise InputError(str(exc)) from exc
        if as_json:
            _print_json(json.loads(snapshot.model_dump_json()))
        elif action == "fork":
            console.print(
                f"fork of {plan_id}: plan {snapshot.plan_id} on {snapshot.agent} is "
                f"[bold]{snapshot.status}[/]",
                highlight=False,
            )
        else:
            gate = f" gate {gate_id}" if gate_id else ""
            console.print(
                f"{action}{gate}: plan {snapshot.plan_id} revision {snapshot.revision} on "
                f"{snapshot.agent} is [bold]{snapshot.status}[/]",
                highlight=False,
            )


@_plan_verb("approve", CONTROL_VERBS["approve"].summary)
def approve(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="For a reconcile gate: the step's output (a JSON object) to record instead of "
            "re-running it, when you found its effect done (a map's gate: "
            '{"items": {"INDEX": output}} for the items that did happen; the others re-run).',
        ),
    ] = None,
    value: Annotated[
        str | None,
        typer.Option(
            "--value",
            help="For a gate that asks: its value, as JSON (e.g. '{\"count\": 3}' or "
            "'\"north\"'), checked against the gate's schema or choices.",
        ),
    ] = None,
    arguments: Annotated[
        str | None,
        typer.Option(
            "--arguments",
            help="For a tool's approval gate: the tool's arguments as you edited them (a JSON "
            "object); the plan goes on as a new revision with you as its author.",
        ),
    ] = None,
    caller: AsOpt = _OPERATOR,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    more: dict[str, Any] = {}
    with _errors():
        if value is not None:
            more["value"] = parse_json_value(value, "--value")
        if arguments is not None:
            more["arguments"] = parse_json_object(arguments, "--arguments")
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
        caller=caller,
        more=more,
    )


@_plan_verb("reject", CONTROL_VERBS["reject"].summary)
def reject(
    plan_id: PlanArg,
    gate_id: GateArg,
    rationale: RationaleOpt,
    caller: AsOpt = _OPERATOR,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    _control(
        plan_id,
        "reject",
        gate_id=gate_id,
        rationale=rationale,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
        caller=caller,
    )


def _plan_only(action: ControlAction) -> Callable[..., None]:
    def command(
        plan_id: PlanArg,
        address: AddressOpt = None,
        state_dir: StateDirOpt = None,
        as_json: JsonOpt = False,
        timeout: TimeoutOpt = None,
    ) -> None:
        _control(
            plan_id, action, address=address, state_dir=state_dir, as_json=as_json, timeout=timeout
        )

    command.__name__ = action
    return command


# The actions that take nothing but the plan: one command body, registered per action.
for _action, _verb in CONTROL_VERBS.items():
    if _verb.plan_only:
        _plan_verb(_action, _verb.summary)(_plan_only(cast("ControlAction", _action)))


@_plan_verb("replan", CONTROL_VERBS["replan"].summary)
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


@_plan_verb("fork", CONTROL_VERBS["fork"].summary)
def fork(
    plan_id: PlanArg,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="The fork point: the steps that succeeded before this step started carry "
            "their results; it and the rest run again in the new plan.",
        ),
    ] = None,
    revision: Annotated[
        int | None,
        typer.Option("--revision", help="The revision forked (default: the newest).", min=1),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="STEP.output=JSON: an output substituted for a step before the fork point "
            "(its dependents run again); repeat for more.",
        ),
    ] = None,
    new_id: Annotated[
        str, typer.Option("--id", help="The new plan's id (default: PLAN-fork-<hex>).")
    ] = "",
    rationale: RationaleOpt = "",
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    with _errors():
        outputs = _substitutions(sets or [])
    _control(
        plan_id,
        "fork",
        rationale=rationale,
        address=address,
        state_dir=state_dir,
        as_json=as_json,
        timeout=timeout,
        more={
            "at_step": at or "",
            "at_revision": revision or 0,
            "outputs": outputs,
            "new_plan_id": new_id,
        },
    )


def _substitutions(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set STEP.output=JSON`` items as step id -> output (each a JSON object)."""
    outputs: dict[str, dict[str, Any]] = {}
    for item in items:
        target, equals, text = item.partition("=")
        step, dot, what = target.partition(".")
        if not (equals and dot and what == "output" and step):
            raise InputError(f"--set {item[:80]!r}: expected STEP.output=JSON")
        if step in outputs:
            raise InputError(f"--set: step {step!r} is given twice")
        outputs[step] = parse_json_object(text, f"--set {step}.output")
    return outputs
