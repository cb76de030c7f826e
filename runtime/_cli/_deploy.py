"""The deployment commands: ``up``, ``status``, ``down`` and ``secret rotate``."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    _deployment,
    _errors,
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

    from stratagem.runtime._directory import AgentInfo
    from stratagem.runtime._launcher import AgentStartError
    from stratagem.runtime._local import LaunchError, LocalCluster

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


# -- deployment ----------------------------------------------------------------------------------


def _agents_table(infos: list[AgentInfo], mode: str | None) -> Table:
    table = Table(title=f"Stratagem agents ({mode} Ray)", title_justify="left")
    for column in (
        "agent",
        "health",
        "endpoint",
        "node",
        "pid",
        "restarts",
        "plans running",
        "blocked",
    ):
        table.add_column(column)
    for info in infos:
        health = {"serving": "[green]serving[/]", "unreachable": "[red]unreachable[/]"}.get(
            info.health, f"[yellow]{info.health} ({info.state.lower()})[/]"
        )
        if info.problem:
            health += f" [red]{escape(info.problem)}[/]"
        table.add_row(
            info.role,
            health,
            info.endpoint or "-",
            " ".join([info.node_id[:8] or "-", *(f"{k}={v}" for k, v in info.node_labels.items())]),
            str(info.pid or "-"),
            "?" if info.restarts is None else str(info.restarts),
            str(info.plans_running),
            str(info.plans_blocked),
        )
    return table


def _show_agents(infos: list[AgentInfo], mode: str | None, as_json: bool) -> None:
    if as_json:
        _print_json(_infos_json(infos, mode))
    else:
        console.print(_agents_table(infos, mode))


def _infos_json(infos: list[AgentInfo], mode: str | None) -> dict[str, Any]:
    return {"mode": mode, "agents": [dataclasses.asdict(info) for info in infos]}


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
    as_json: JsonOpt = False,
) -> None:
    """Deploy the agents (the four built-in ones and those extensions define) as detached actors
    (starting a local Ray head when no address)."""
    with _errors():
        settings = _settings(
            address, state_dir, allow_unauthenticated_ray=allow_unauthenticated_ray or None
        )
        # Agents also append their spans to a file in the state directory (on their own node),
        # so `stratagem trace` works without a backend on one machine.
        settings = settings.model_copy(
            update={"trace_file": settings.trace_file or settings.state_dir / "spans.jsonl"}
        )
        deployment = _deployment(settings)
        # The extensions first: one that does not load (or defines an agent badly) stops here,
        # before a Ray head starts.
        roles = deployment.roles
        started: LocalCluster | None = None
        if settings.address is None and LocalCluster.find(settings.local_cluster_file) is None:
            if not as_json:
                err_console.print("[dim]starting a local Ray head…[/]")
            started = LocalCluster.start(settings)
        if not as_json:
            err_console.print(f"[dim]deploying the agents: {', '.join(roles)}…[/]", highlight=False)
        try:
            with _running(deployment):
                infos = deployment.deploy(detached=True, replace=replace)
        except AgentStartError:
            # A refused agent leaves nothing running: deploy removed the agents, and the Ray
            # head this command started goes too.
            if started is not None:
                started.stop()
                settings.local_cluster_file.unlink(missing_ok=True)
                settings.ray_token_path.unlink(missing_ok=True)
            raise
        for warning in deployment.warnings:
            err_console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True, highlight=False)
        if as_json:
            _print_json({**_infos_json(infos, deployment.mode), "stale": deployment.stale})
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

    Exits 1 when an agent is not serving (a readiness check for scripts)."""
    with _errors():
        deployment = _deployment(_settings(address, state_dir))
        with _running(deployment):
            infos = deployment.status()
        _show_agents(infos, deployment.mode, as_json)
        sick = [
            info.role + (f" ({info.problem})" if info.problem else "")
            for info in infos
            if info.health != "serving"
        ]
        if sick:
            raise LaunchError(f"not serving: {', '.join(sick)}")


@secret_app.command("rotate")
def secret_rotate(
    address: AddressOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Make a new cluster secret and redeploy the agents with it (as 'up --replace' does):
    tokens signed with the old secret stop passing; plans continue from their stores."""
    with _errors():
        from stratagem.runtime._rotation import rotate_secret  # joins Ray

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
    """Remove the agents (and the local Ray head that 'up' started, if any)."""
    with _errors():
        settings = _settings(address, state_dir)
        deployment = _deployment(settings)
        recorded = None if settings.address else LocalCluster.recorded(settings.local_cluster_file)
        local = recorded if recorded is not None and recorded.alive else None
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
        elif recorded is not None:  # the head died: clean up after it
            cleaned = recorded.clean_up(settings)
        if as_json:
            _print_json(
                {"removed": removed, "stopped_local_ray": local is not None, "cleaned": cleaned}
            )
        elif recorded is not None and local is None:
            console.print(
                f"the local Ray head (pid {recorded.pid}) was already gone; cleaned up: "
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
