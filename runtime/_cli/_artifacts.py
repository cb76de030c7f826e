"""``artifacts list | show | get | provenance``: what plans saved, read from the deployment's
artifact store (no agent needs to be running)."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stratagem.runtime._cli._app import (
    _CONTEXT,
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    _errors,
    _fail,
    _print_json,
    _settings,
    app,
    console,
    lazy_scope,
)

if TYPE_CHECKING:
    from rich.table import Table

    from stratagem.runtime.operator._artifacts import ArtifactsClient

__all__: list[str] = []

lazy_scope(globals())

artifacts_app = typer.Typer(
    help="Artifacts: what plans saved, versioned, with their provenance.",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(artifacts_app, name="artifacts")

NameArg = Annotated[str, typer.Argument(help="The artifact's name.", show_default=False)]
ScopeOpt = Annotated[
    str | None,
    typer.Option("--scope", help="plan, goal, agent or deployment (default: deployment)."),
]
ScopeIdOpt = Annotated[
    str | None, typer.Option("--scope-id", help="The plan, goal or agent id of the scope.")
]
PlanOpt = Annotated[
    str | None,
    typer.Option("--plan", help="A plan's artifacts: the same as --scope plan --scope-id PLAN."),
]
VersionOpt = Annotated[
    int | None, typer.Option("--version", help="A version (default: the newest).", min=1)
]


def _where(scope: str | None, scope_id: str | None, plan: str | None) -> tuple[str, str]:
    if plan is not None:
        if scope not in (None, "plan"):
            _fail(f"--plan names a plan's artifacts; --scope {scope} names another scope", 2)
        return "plan", plan
    return scope or "deployment", scope_id or ""


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _client(address: str | None, state_dir: Path | None) -> ArtifactsClient:
    return ArtifactsClient(_settings(address, state_dir))


@artifacts_app.command("list")
def artifacts_list(
    scope: ScopeOpt = None,
    scope_id: ScopeIdOpt = None,
    plan: PlanOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="Only this name.")] = None,
    all_versions: Annotated[bool, typer.Option("--all", help="Every version, not the newest.")] = (
        False
    ),
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List artifacts: each name's newest version (every version with --all).

    Examples:

      stratagem artifacts list

      stratagem artifacts list --plan report-1 --json
    """
    with _errors():
        if plan is not None:
            scope, scope_id = _where(scope, scope_id, plan)
        client = _client(address, state_dir)
        try:
            records = client.list_blocking(
                scope=scope, scope_id=scope_id, name=name, all_versions=all_versions
            )
        finally:
            client.close()
        if as_json:
            _print_json([record.to_json() for record in records])
            return
        table = Table(box=None, pad_edge=False)
        for column in ("name", "version", "scope", "size", "media type", "digest", "saved"):
            table.add_column(column, overflow="fold")
        for r in records:
            where = f"{r.scope}/{r.scope_id}" if r.scope_id else r.scope
            table.add_row(
                r.name,
                str(r.version),
                where,
                str(r.size),
                r.media_type,
                r.digest[:16],
                _when(r.created_at),
            )
        console.print(table)
        if not records:
            typer.echo("no artifact yet: a plan's artifact.save step makes one", err=True)


@artifacts_app.command("show")
def artifacts_show(
    name: NameArg,
    scope: ScopeOpt = None,
    scope_id: ScopeIdOpt = None,
    plan: PlanOpt = None,
    version: VersionOpt = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one artifact version's record: media type, size, digest, scope and provenance.

    Examples:

      stratagem artifacts show report.md --plan report-1
    """
    with _errors():
        where, where_id = _where(scope, scope_id, plan)
        client = _client(address, state_dir)
        try:
            record = client.show_blocking(name, scope=where, scope_id=where_id, version=version)
        finally:
            client.close()
        if as_json:
            _print_json(record.to_json())
            return
        _print_record(record.to_json())


def _print_record(data: dict[str, Any]) -> None:
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column("field", style="dim")
    table.add_column("value", overflow="fold")
    for key in ("name", "version", "media_type", "size", "digest", "scope", "scope_id"):
        table.add_row(key, str(data[key]))
    table.add_row("saved", _when(float(data["created_at"])))
    console.print(table)


@artifacts_app.command("get")
def artifacts_get(
    name: NameArg,
    scope: ScopeOpt = None,
    scope_id: ScopeIdOpt = None,
    plan: PlanOpt = None,
    version: VersionOpt = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write to this file (default: standard output)."),
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Write an artifact's bytes, checked against its digest (a corrupted blob is refused).

    Examples:

      stratagem artifacts get report.md --plan report-1 -o report.md
    """
    with _errors():
        where, where_id = _where(scope, scope_id, plan)
        client = _client(address, state_dir)
        try:
            record, data = client.get_blocking(
                name, scope=where, scope_id=where_id, version=version
            )
        finally:
            client.close()
        if output is None:
            # standard output as ``_errors`` keeps it (it sends other writers to standard error)
            out = console.file
            if out.isatty() and not record.media_type.startswith(("text/", "application/json")):
                _fail(
                    f"{record.key} is {record.media_type}: not written to a terminal "
                    "(use --output FILE or a pipe)",
                    2,
                )
            out.flush()
            out.buffer.write(data)  # type: ignore[attr-defined]  # a text stream over bytes
            out.buffer.flush()  # type: ignore[attr-defined]
            return
        _write_file(output, data)
        typer.echo(f"wrote {record.key} ({record.size} bytes) to {output}", err=True)


def _write_file(path: Path, data: bytes) -> None:
    """``data`` into ``path`` whole or not at all (a temporary file beside it, then renamed)."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        _fail(f"--output: folder {folder} does not exist", 2)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        _fail(f"--output: cannot write {path}: {exc.strerror or exc}", 1)


@artifacts_app.command("provenance")
def artifacts_provenance(
    name: NameArg,
    scope: ScopeOpt = None,
    scope_id: ScopeIdOpt = None,
    plan: PlanOpt = None,
    version: VersionOpt = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show who made an artifact version and from what: agent, plan, step, attempt, tool, inputs.

    Examples:

      stratagem artifacts provenance report.md --plan report-1
    """
    with _errors():
        where, where_id = _where(scope, scope_id, plan)
        client = _client(address, state_dir)
        try:
            lineage = client.provenance_blocking(
                name, scope=where, scope_id=where_id, version=version
            )
        finally:
            client.close()
        record, prov = lineage.record, lineage.record.provenance
        if as_json:
            _print_json(
                {
                    "artifact": record.to_json(),
                    "inputs": [r.to_json() for r in lineage.inputs],
                    "unknown_inputs": list(lineage.unknown_inputs),
                }
            )
            return
        table = Table(box=None, pad_edge=False, show_header=False)
        table.add_column("field", style="dim")
        table.add_column("value", overflow="fold")
        table.add_row("artifact", f"{record.key} sha256:{record.digest}")
        table.add_row("agent", prov.agent or "-")
        if prov.plan_id:
            table.add_row("plan", f"{prov.plan_id} rev {prov.revision}")
            table.add_row("step", f"{prov.step_id} attempt {prov.attempt}")
        table.add_row("tool", f"{prov.tool or '-'} {prov.tool_version}".strip())
        table.add_row("time", _when(prov.time) if prov.time else "-")
        for made in lineage.inputs:
            table.add_row("input", f"{made.key} sha256:{made.digest}")
        for digest in lineage.unknown_inputs:
            table.add_row("input", f"sha256:{digest}")
        console.print(table)
        if prov.plan_id:
            typer.echo(f"the step: stratagem plans show {prov.plan_id}", err=True)
