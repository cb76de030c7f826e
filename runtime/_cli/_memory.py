"""``memory put | get | list | search | delete``: the deployment's memory
(``docs/artifacts-memory.md``).

The commands open the memory store themselves (no agent needs to run), as the operator under the
deployment's policy, and each write is audited (``runtime.operator._memory``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from stratagem.runtime._cli._app import (
    JsonOpt,
    StateDirOpt,
    _errors,
    _fail,
    _print_json,
    app,
    console,
    err_console,
)

__all__: list[str] = []

memory_app = typer.Typer(
    help="The deployment's memory: JSON values by namespace and key, recalled by words.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(memory_app, name="memory")

NamespaceOpt = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        help="A namespace, its parts joined by '/': user/ana, agent/tactical, goal/g-17.",
        show_default=False,
    ),
]
KeyOpt = Annotated[str, typer.Option("--key", "-k", help="The key.", show_default=False)]
LimitOpt = Annotated[int, typer.Option("--limit", help="The most items to show (1-1000).")]


def _client(state_dir: Any) -> Any:
    from stratagem.runtime._cli._app import _settings
    from stratagem.runtime.operator._memory import SyncMemoryClient

    return SyncMemoryClient(settings=_settings(None, state_dir))


def _value(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        _fail(f"{option}: not JSON: {exc} (a string is quoted: '\"pears\"')", 2)


def _filters(pairs: Sequence[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        field, sep, text = pair.partition("=")
        if not sep or not field:
            _fail(f"--filter: {pair!r} is not FIELD=VALUE (status=open, n=3, who.name=ana)", 2)
        try:
            found[field] = json.loads(text)
        except ValueError:
            found[field] = text  # a bare word is a string
    return found


def _print_items(items: Sequence[Any], as_json: bool, *, scores: bool = False) -> None:
    if as_json:
        _print_json([item.to_json() for item in items])
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    table.add_column("namespace", overflow="fold")
    table.add_column("key", overflow="fold")
    if scores:
        table.add_column("score", justify="right")
    table.add_column("value", overflow="fold")
    table.add_column("updated")
    for item in items:
        value = json.dumps(item.value, ensure_ascii=False)
        row = ["/".join(item.namespace), item.key]
        if scores:
            row.append("" if item.score is None else f"{item.score:.3g}")
        row += [value if len(value) <= 200 else value[:199] + "…", item.updated_at.isoformat()]
        table.add_row(*row)
    console.print(table, markup=False, highlight=False)
    if not items:
        err_console.print("[dim]no item[/]")


@memory_app.command("put")
def memory_put(
    namespace: NamespaceOpt,
    key: KeyOpt,
    value: Annotated[
        str, typer.Option("--value", "-v", help="The value, as JSON.", show_default=False)
    ],
    ttl: Annotated[
        float | None,
        typer.Option("--ttl", help="Seconds until it expires (positive); none: never."),
    ] = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Keep a JSON value under a namespace and key (replacing what was there).

    Examples:

      stratagem memory put --namespace user/ana --key likes --value '{"fruit": "pears"}'

      stratagem memory put -n goal/g-17 -k draft -v '"first try"' --ttl 3600
    """
    with _errors():
        data = _value(value, "--value")
        if ttl is not None and not 0 < ttl < float("inf"):
            _fail(f"--ttl: must be a positive number of seconds, got {ttl:g}", 2)
        with _client(state_dir) as memory:
            item = memory.put(namespace, key, data, ttl_s=ttl)
        if as_json:
            _print_json(item.to_json())
            return
        expires = "" if item.expires_at is None else f" until {item.expires_at.isoformat()}"
        console.print(f"kept {'/'.join(item.namespace)} {item.key}{expires}", highlight=False)


@memory_app.command("get")
def memory_get(
    namespace: NamespaceOpt,
    key: KeyOpt,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the value kept under a namespace and key (exit 1 when there is none).

    Examples:

      stratagem memory get --namespace user/ana --key likes

      stratagem memory get -n user/ana -k likes --json | jq .value
    """
    with _errors():
        with _client(state_dir) as memory:
            item = memory.get(namespace, key)
        if item is None:
            _fail(f"no item {key!r} in memory namespace {namespace!r}", 1)
        if as_json:
            _print_json(item.to_json())
            return
        console.print_json(json.dumps(item.value))


@memory_app.command("list")
def memory_list(
    namespace: NamespaceOpt,
    limit: LimitOpt = 100,
    offset: Annotated[int, typer.Option("--offset", help="Items to skip.")] = 0,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the items of a namespace and of every namespace below it.

    Examples:

      stratagem memory list --namespace user/ana

      stratagem memory list -n agent --json
    """
    with _errors():
        with _client(state_dir) as memory:
            items = memory.list(namespace, limit=limit, offset=offset)
        _print_items(items, as_json)


@memory_app.command("search")
def memory_search(
    namespace: NamespaceOpt,
    query: Annotated[
        str | None,
        typer.Argument(help="Words to recall by; none: the newest items.", show_default=False),
    ] = None,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="FIELD=VALUE the value must hold (VALUE is JSON, or else a string); repeatable.",
        ),
    ] = None,
    limit: LimitOpt = 10,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Recall the items of a namespace (and below) best matching words, best first.

    Examples:

      stratagem memory search --namespace user/ana "pears and figs"

      stratagem memory search -n goal --filter status=open --json
    """
    with _errors():
        wanted = _filters(filters or [])
        with _client(state_dir) as memory:
            items = memory.search(namespace, query, filter=wanted or None, limit=limit)
        _print_items(items, as_json, scores=True)


@memory_app.command("delete")
def memory_delete(
    namespace: NamespaceOpt,
    key: KeyOpt,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove the item under a namespace and key.

    Examples:

      stratagem memory delete --namespace user/ana --key likes
    """
    with _errors():
        with _client(state_dir) as memory:
            found = memory.delete(namespace, key)
        if as_json:
            _print_json({"namespace": namespace, "key": key, "deleted": found})
            return
        console.print(
            f"deleted {namespace} {key}" if found else f"no item {key!r} in {namespace}",
            highlight=False,
        )
