"""The deployment commands: ``up``, ``status``, ``down`` and ``secret rotate``."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.markup import escape

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    _deployment,
    _errors,
    _load_ray,
    _print_json,
    _running,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
    secret_app,
)

if TYPE_CHECKING:
    from rich.table import Table

    from stratagem.runtime.config._deployed import (
        DeploymentRecord,
        absolute_extensions,
        read_record,
        remove_record,
        write_record,
    )
    from stratagem.runtime.config._extensions import settings_roles
    from stratagem.runtime.config._settings import Settings
    from stratagem.runtime.host._directory import AgentInfo
    from stratagem.runtime.host._launcher import AgentStartError, Deployment
    from stratagem.runtime.host._local import LaunchError, LocalCluster, read_published
    from stratagem.runtime.host._rotation import rotate_secret
    from stratagem.runtime.operator._operator import check_role

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


# -- deployment ----------------------------------------------------------------------------------


def _agents_table(infos: list[AgentInfo], mode: str | None, width: int | None = None) -> Table:
    """The agents as a table that fits ``width`` columns (the console's): below 100, no box, and
    the node column only when the agents run on more than one node or on labelled nodes; the
    model column only when an agent plans with a model (its tier's: ``AgentInfo.model``)."""
    narrow = (width or console.width) < 100
    nodes = {info.node_id for info in infos} | {"" for info in infos if info.node_labels}
    show_node = not narrow or len(nodes) > 1
    table = Table(
        title=f"Stratagem agents ({mode} Ray)",
        title_justify="left",
        box=None if narrow else box.HEAVY_HEAD,
        pad_edge=not narrow,
    )
    columns = ["agent", "health", "endpoint", *(["node"] if show_node else [])]
    columns += ["pid", "restarts", "running" if narrow else "plans running", "blocked"]
    show_model = any(info.model for info in infos)
    columns += ["model"] if show_model else []
    for column in columns:
        table.add_column(column, overflow="fold")
    for info in infos:
        health = {"serving": "[green]serving[/]", "unreachable": "[red]unreachable[/]"}.get(
            info.health, f"[yellow]{info.health} ({info.state.lower()})[/]"
        )
        if info.problem:
            health += f" [red]{escape(info.problem)}[/]"
        node = " ".join(
            [info.node_id[:8] or "-", *(f"{k}={v}" for k, v in info.node_labels.items())]
        )
        table.add_row(
            info.role,
            health,
            info.endpoint or "-",
            *([node] if show_node else []),
            str(info.pid or "-"),
            "?" if info.restarts is None else str(info.restarts),
            str(info.plans_running),
            str(info.plans_blocked),
            *([escape(info.model) or "rules"] if show_model else []),
        )
    return table


def _show_agents(infos: list[AgentInfo], mode: str | None, as_json: bool) -> None:
    if as_json:
        _print_json(_infos_json(infos, mode))
    else:
        console.print(_agents_table(infos, mode))


def _infos_json(infos: list[AgentInfo], mode: str | None) -> dict[str, Any]:
    return {"mode": mode, "agents": [dataclasses.asdict(info) for info in infos]}


def _record_for(settings: Settings) -> DeploymentRecord:
    """What ``up`` deploys and records: the extensions (file paths made absolute) and the folders
    they come from, this one added when the set is named here rather than taken from the record
    (agents on this machine import extension modules from where the user launched ``up``)."""
    extensions = absolute_extensions(settings.extensions, Path.cwd())
    paths = list(settings.extension_paths)
    recorded = read_record(settings.state_dir)
    named_here = recorded is None or recorded.extensions != extensions
    if extensions and named_here and Path.cwd() not in paths:
        paths.append(Path.cwd())
    return DeploymentRecord(extensions=extensions, extension_paths=tuple(paths))


def _with_planning(
    record: DeploymentRecord, settings: Settings, roles: Sequence[str]
) -> DeploymentRecord:
    """``record`` with how long each of ``roles`` may take to plan one request, as deployed with
    ``settings`` (what a goal's default deadline is made of: ``Operator.submit``)."""
    planning = {role: settings.planning_timeout_s(role) for role in roles}
    return dataclasses.replace(record, planning_timeout_s=planning)


@app.command()
def up(
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Redeploy running agents.")] = False,
    allow_unauthenticated_ray: Annotated[
        bool | None,
        typer.Option(
            "--allow-unauthenticated-ray",
            help="Deploy onto an external Ray that asks for no token (anyone reaching it owns "
            "the agents).",
        ),
    ] = None,
    extensions: Annotated[
        str | None,
        typer.Option(
            "--extensions",
            help="Extensions to load, comma-separated ('' for none; else STRATAGEM_EXTENSIONS, "
            "else the set the running deployment has). Every later command uses them.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Deploy the agents (the four built-in ones and those extensions define) as detached actors
    (starting a local Ray head when no address).

    Running agents are kept; with another set of extensions, the agents that load another set
    are redeployed and those no extension defines any more are removed. The set is recorded in
    the state directory: every command, from any shell, uses it.

    Examples:

      stratagem up

      stratagem up --extensions examples.extensions.critic

      stratagem up --replace
    """
    with _errors():
        settings, record = _up_settings(address, state_dir, allow_unauthenticated_ray, extensions)
        deployment = _deployment(settings)
        # The extensions first: one that does not load (or defines an agent badly) stops here,
        # before a Ray head starts.
        roles = deployment.roles
        started = _start_local_head(settings, as_json=as_json)
        if not as_json:
            err_console.print(f"[dim]deploying the agents: {', '.join(roles)}…[/]", highlight=False)
        infos = _deploy_or_stop(deployment, settings, started, replace=replace)
        write_record(settings.state_dir, _with_planning(record, settings, roles))
        _report_changes(deployment, as_json=as_json)
        _show_deployed(infos, deployment, record, as_json=as_json)


def _up_settings(
    address: str | None,
    state_dir: Path | None,
    allow_unauthenticated_ray: bool | None,
    extensions: str | None,
) -> tuple[Settings, DeploymentRecord]:
    """The settings ``up`` deploys with (the extensions its options name, else the record's, and
    a trace file) and the record it writes."""
    more: dict[str, Any] = {}
    if extensions is not None:
        more["extensions"] = [name for name in extensions.split(",") if name.strip()]
    settings = _settings(
        address, state_dir, allow_unauthenticated_ray=allow_unauthenticated_ray or None, **more
    )
    record = _record_for(settings)
    settings = settings.model_copy(
        update={
            "extensions": list(record.extensions),
            "extension_paths": list(record.extension_paths),
        }
    )
    # Agents also append their spans to a file in the state directory (on their own node),
    # so `stratagem trace` works without a backend on one machine.
    settings = settings.model_copy(
        update={"trace_file": settings.trace_file or settings.state_dir / "spans.jsonl"}
    )
    return settings, record


def _start_local_head(settings: Settings, *, as_json: bool) -> LocalCluster | None:
    """A local Ray head started for ``settings`` when they name no address and none runs (else
    ``None``: the deployment joins the one there is)."""
    if settings.address is not None or LocalCluster.find(settings.local_cluster_file) is not None:
        return None
    if not as_json:
        err_console.print("[dim]starting a local Ray head…[/]")
    return LocalCluster.start(settings)


def _deploy_or_stop(
    deployment: Deployment, settings: Settings, started: LocalCluster | None, *, replace: bool
) -> list[AgentInfo]:
    """Deploy the agents as detached actors; when one is refused, stop the Ray head ``started``
    (if this command started one) and re-raise."""
    try:
        with _running(deployment):
            return deployment.deploy(detached=True, replace=replace)
    except AgentStartError:
        # A refused agent leaves nothing running: deploy removed the agents, and the Ray
        # head this command started goes too.
        if started is not None:
            started.stop()
            settings.local_cluster_file.unlink(missing_ok=True)
            settings.ray_token_path.unlink(missing_ok=True)
        raise


def _report_changes(deployment: Deployment, *, as_json: bool) -> None:
    """Say on standard error which agents ``up`` redeployed or removed (not with ``--json``) and
    the deployment's warnings."""
    if deployment.replaced and not as_json:
        err_console.print(
            f"[dim]redeployed {', '.join(deployment.replaced)}: they ran with other extensions[/]",
            soft_wrap=True,
            highlight=False,
        )
    if deployment.removed and not as_json:
        err_console.print(
            f"[dim]removed {', '.join(deployment.removed)}: no extension defines "
            f"{'it' if len(deployment.removed) == 1 else 'them'} now[/]",
            soft_wrap=True,
            highlight=False,
        )
    for warning in deployment.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True, highlight=False)


def _show_deployed(
    infos: list[AgentInfo],
    deployment: Deployment,
    record: DeploymentRecord,
    *,
    as_json: bool,
) -> None:
    """Print the deployed agents (a table, or ``--json`` with what changed), and warn of those
    kept running with other settings."""
    if as_json:
        _print_json(
            {
                **_infos_json(infos, deployment.mode),
                "stale": deployment.stale,
                "replaced": deployment.replaced,
                "removed": deployment.removed,
                "extensions": list(record.extensions),
            }
        )
        return
    console.print(_agents_table(infos, deployment.mode))
    if deployment.stale:
        err_console.print(
            f"[yellow]warning:[/] {', '.join(deployment.stale)} kept running with other "
            "settings than this command's; 'stratagem up --replace' redeploys them",
            soft_wrap=True,
        )


@app.command()
def status(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Show each agent's health, node, gRPC endpoint, process, restarts and running plans.

    Exits 1 when an agent is not serving, or there is no deployment (a readiness check for
    scripts; --json then prints {"found": false, "mode": null, "agents": [], "problem": ...}).

    Examples:

      stratagem status

      stratagem status --json | jq '.agents[] | {role, health, traces}'
    """
    with _errors():
        deployment = _deployment(_settings(address, state_dir))
        try:
            with _running(deployment):
                infos = deployment.status()
        except LaunchError as exc:
            if as_json:  # none found, Ray not reached, or no agent of it answering
                found = deployment.mode is not None
                _print_json(
                    {"found": found, "mode": deployment.mode, "agents": [], "problem": str(exc)}
                )
            raise
        if as_json:
            _print_json({"found": True, **_infos_json(infos, deployment.mode)})
        else:
            _show_agents(infos, deployment.mode, False)
        gone = [_named(info) for info in infos if info.health == "not deployed"]
        sick = [_named(info) for info in infos if info.health not in ("serving", "not deployed")]
        problems = [f"agents not deployed: {', '.join(gone)}"] if gone else []
        problems += [f"not serving: {', '.join(sick)}"] if sick else []
        if problems:
            raise LaunchError("; ".join(problems))


def _named(info: AgentInfo) -> str:
    """An agent's role, with its problem when it has one."""
    return info.role + (f" ({info.problem})" if info.problem else "")


@secret_app.command("rotate")
def secret_rotate(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Make a new cluster secret and redeploy the agents with it (as 'up --replace' does):
    tokens signed with the old secret stop passing; plans continue from their stores."""
    with _errors():
        _load_ray()  # rotate_secret joins Ray
        settings = _settings(address, state_dir)
        settings = settings.model_copy(
            update={"trace_file": settings.trace_file or settings.state_dir / "spans.jsonl"}
        )
        deployment = _deployment(settings)
        with _running(deployment):
            key_id, infos = rotate_secret(deployment)
        if as_json:
            _print_json({**_infos_json(infos, deployment.mode), "key_id": key_id})
            return
        console.print(_agents_table(infos, deployment.mode))
        err_console.print(
            f"new cluster secret {key_id} in {settings.secret_path}; copy it to every other "
            "operator machine (their old copy is refused now)",
            soft_wrap=True,
        )


@app.command()
def down(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove the agents (and the local Ray head that 'up' started, if any).

    The plans, answers, worlds and audit log stay in the state directory: the next 'up' goes on
    from them.

    Examples:

      stratagem down
    """
    with _errors():
        settings = _settings(address, state_dir)
        deployment = _deployment(settings)
        recorded = None if settings.address else LocalCluster.recorded(settings.local_cluster_file)
        # Only a head proven to be the one 'up' started is joined or signalled.
        local = recorded if recorded is not None and recorded.proven else None
        removed: list[str] = []
        cleaned: list[str] = []
        if settings.address or (local is not None and settings.ray_token_path.is_file()):
            with _running(deployment):
                removed = deployment.teardown()
        # A local head whose token is gone cannot be joined: stopping it stops its agents too.
        if local is not None:
            local.stop()
            settings.local_cluster_file.unlink(missing_ok=True)
            settings.ray_token_path.unlink(missing_ok=True)
        elif recorded is not None:  # the head died (or the record proves nothing): clean up
            cleaned = recorded.clean_up(settings)
        if removed or local is not None or recorded is not None:
            remove_record(settings.state_dir)
        if as_json:
            _print_json(
                {"removed": removed, "stopped_local_ray": local is not None, "cleaned": cleaned}
            )
        elif recorded is not None and local is None:
            console.print(
                (
                    f"the local Ray head recorded (pid {recorded.pid}) {recorded.unproven()}: "
                    f"pid {recorded.pid} runs but is not proven the head, so it was not "
                    "signalled; cleaned up: "
                    if recorded.alive
                    else f"the local Ray head (pid {recorded.pid}) was already gone; cleaned up: "
                )
                + (", ".join(cleaned) or "nothing was left"),
                soft_wrap=True,
                highlight=False,
            )
        elif not removed and local is None:
            console.print("nothing to stop: no Stratagem deployment found")
        else:
            console.print(
                f"removed agents: {', '.join(removed) or 'none'}"
                + ("; stopped the local Ray head" if local is not None else "")
            )


# -- logs ----------------------------------------------------------------------------------------

_TAIL_LIMIT = 8 << 20
"""The most bytes ``logs`` reads from the end of a log file."""


def _tail(path: Path, lines: int) -> tuple[bytes, int]:
    """The last ``lines`` lines of ``path`` (reading at most ``_TAIL_LIMIT`` bytes from its end)
    and the file's size then."""
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        if lines == 0:
            return b"", size
        start = size
        chunk = b""
        while start > 0 and chunk.count(b"\n") <= lines and size - start < _TAIL_LIMIT:
            step = min(64 << 10, start)
            start -= step
            handle.seek(start)
            chunk = handle.read(step) + chunk
        kept = chunk.splitlines(keepends=True)[-lines:]
        return b"".join(kept), size


@app.command()
def logs(
    agent: Annotated[str, typer.Argument(help="An agent's role, e.g. perception.")],
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=0, max=100_000, help="How many lines to print.")
    ] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what it logs (Ctrl-C stops).")
    ] = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Print the end of an agent's log: what its process wrote (a Ray worker's .out and .err).

    The agent says where its log is when it starts (an agent of this machine's deployment); an
    agent restarted by Ray logs to new files, which this then reads.

    Examples:

      stratagem logs perception

      stratagem logs orchestrator -n 200

      stratagem logs critic --follow
    """
    with _errors():
        settings = _settings(None, state_dir)
        check_role(agent, settings_roles(settings))
        published = read_published(settings.state_dir, agent)
        if published is None:
            raise LaunchError(
                f"agent {agent} has not said where it logs in {settings.state_dir}: it is not "
                "deployed, or runs on another machine (its log is then with Ray's worker logs "
                "on its node; 'stratagem status' says which)"
            )
        files = [path for path in published.logs if path.is_file()]
        if not files:
            raise LaunchError(
                f"agent {agent} (pid {published.pid}) named no log file this machine has "
                "(its log is with Ray's worker logs on its node)"
            )
        if not published.alive:
            err_console.print(
                f"[yellow]agent {agent}'s process {published.pid} has ended; its last log:[/]",
                highlight=False,
            )
        out = console.file
        sizes: dict[Path, int] = {}
        for path in files:
            if len(files) > 1:
                err_console.print(f"[dim]==> {path} <==[/]", highlight=False)
            text, sizes[path] = _tail(path, lines)
            out.write(text.decode("utf-8", "replace"))
            out.flush()
        if not follow:
            return
        try:
            while True:
                time.sleep(0.5)
                for path in files:
                    with path.open("rb") as handle:
                        handle.seek(sizes[path])
                        more = handle.read(1 << 20)
                    if more:
                        sizes[path] += len(more)
                        out.write(more.decode("utf-8", "replace"))
                        out.flush()
        except KeyboardInterrupt:
            return
