"""``world list | show | reset``: the perception agent's named worlds."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from stratagem.runtime._cli._app import (
    AddressOpt,
    JsonOpt,
    StateDirOpt,
    _errors,
    _operate,
    _print_json,
    _settings,
    console,
    err_console,
    lazy_scope,
    world_app,
)

if TYPE_CHECKING:
    from rich.table import Table

    from stratagem.runtime.operator._render import relation_text

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())

WorldArg = Annotated[
    str,
    typer.Argument(
        help="A world's name: lowercase letters, digits, '_', '.' and '-' (goals that name no "
        "world get one named after their plan id).",
        show_default=False,
    ),
]


@world_app.command("list")
def world_list(
    prefix: Annotated[
        str, typer.Option("--prefix", help="Only worlds whose name starts with this.")
    ] = "",
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the worlds with their version and size.

    Examples:

      stratagem world list

      stratagem world list --prefix goal-
    """
    with _errors():
        listed = _operate(_settings(address, state_dir), lambda op: op.worlds(prefix=prefix))
        if as_json:
            _print_json(listed.model_dump(mode="json"))
            return
        table = Table(box=None, pad_edge=False)
        table.add_column("world", overflow="fold")
        table.add_column("version", justify="right")
        table.add_column("entities", justify="right")
        table.add_column("facts", justify="right")
        for summary in listed.worlds:
            table.add_row(
                summary.name, str(summary.version), str(summary.entities), str(summary.facts)
            )
        console.print(table)
        shown = len(listed.worlds)
        if listed.total > shown:
            err_console.print(f"[dim]{shown} of {listed.total} worlds shown: use --prefix[/]")
        elif not shown:
            err_console.print("[dim]no world yet: a goal or a perception request makes one[/]")


@world_app.command("show")
def world_show(
    world: WorldArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show everything a world holds: its entities and facts.

    Examples:

      stratagem world show default

      stratagem world show "$(stratagem submit examples/lighthouse.yaml --json | jq -r .world)"
    """
    with _errors():
        shown = _operate(_settings(address, state_dir), lambda op: op.world(world))
        if as_json:
            _print_json(shown.model_dump(mode="json"))
            return
        console.print(
            f"[bold]world {shown.world}[/] · version {shown.version} · "
            f"{len(shown.entities)} entities · {len(shown.facts)} facts",
            highlight=False,
        )
        entities = Table(box=None, pad_edge=False)
        entities.add_column("entity", overflow="fold")
        entities.add_column("kind")
        entities.add_column("name", overflow="fold")
        for entity in shown.entities:
            entities.add_row(entity.id, entity.kind, entity.name)
        console.print(entities)
        facts = Table(box=None, pad_edge=False)
        facts.add_column("fact", overflow="fold")
        for fact in shown.facts:
            facts.add_row(relation_text(fact))
        console.print(facts)


@world_app.command("reset")
def world_reset(
    world: WorldArg,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Empty a world: no entity, no fact (goals that name it start from their passage alone).

    Examples:

      stratagem world reset default

      stratagem submit examples/lighthouse.yaml --world lab && stratagem world reset lab
    """
    with _errors():
        reset = _operate(_settings(address, state_dir), lambda op: op.reset_world(world))
        if as_json:
            _print_json(reset.model_dump(mode="json"))
            return
        console.print(
            f"world {reset.world} reset: {reset.entities_removed} entities and "
            f"{reset.facts_removed} facts removed (version {reset.version})",
            highlight=False,
        )
