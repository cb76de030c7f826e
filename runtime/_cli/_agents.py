"""``request`` and ``describe``: one agent, one call."""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Annotated

import typer

from stratagem.runtime._cli._app import (
    _OPERATOR,
    AddressOpt,
    EmbeddedOpt,
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _errors,
    _operate,
    _print_json,
    _settings,
    app,
    console,
    lazy_scope,
)
from stratagem.runtime.operator._input import InputError, parse_json_object, unknown_name

if TYPE_CHECKING:
    from rich.table import Table

    from stratagem.runtime.operator._operator import capability_spec
    from stratagem.runtime.telemetry._telemetry import setup_telemetry, shutdown_telemetry

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


@app.command()
def request(
    agent: Annotated[str, typer.Argument(help="Target agent role.")],
    capability: Annotated[str, typer.Argument(help="Capability name, e.g. ExtractEntities.")],
    payload: Annotated[str, typer.Option("--json", help="The request as a JSON object.")] = "{}",
    caller: Annotated[
        str,
        typer.Option(
            "--as",
            help="Who the request is from: the operator (default), or an identity its "
            "credentials cover; never an agent.",
        ),
    ] = _OPERATOR,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    timeout: TimeoutOpt = None,
    embedded: EmbeddedOpt = False,
) -> None:
    """Send one cross-agent request and print the answer as JSON.

    Examples:

      stratagem request perception ExtractEntities --json '{"text": "Mira waits in the hall."}'

      stratagem request perception ListWorlds
    """
    with _errors():
        settings = _settings(address, state_dir)
        capability_spec(settings, agent, capability)  # an unknown name before a bad payload
        raw = parse_json_object(payload, "--json")
        # One request id whichever way the call goes: a repeat gets the stored answer.
        request_id = f"cli-{uuid.uuid4().hex}"
        setup_telemetry(
            "stratagem-cli", trace_file=settings.trace_file, state_dir=settings.state_dir
        )
        try:
            answer = _operate(
                settings,
                lambda op: op.call(agent, capability, raw, request_id=request_id),
                timeout=timeout,
                caller=caller,
                embedded=embedded,
            )
        finally:
            shutdown_telemetry("stratagem-cli")
        _print_json(answer.model_dump(mode="json"))


@app.command()
def describe(
    agent: Annotated[str, typer.Argument(help="An agent's role, e.g. perception.")],
    capability: Annotated[
        str | None, typer.Argument(help="One capability: its request and response schemas.")
    ] = None,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What an agent serves: capabilities, versions, schemas, tools, and the model its planner
    uses when it plans with one (the Describe RPC).

    Examples:

      stratagem describe perception

      stratagem describe strategic PlanNarrativeArc --json
    """
    with _errors():
        settings = _settings(address, state_dir)
        card = _operate(settings, lambda op: op.describe(agent))
        cards = {c.name: c for c in card.capabilities}
        if capability is not None and capability not in cards:
            raise InputError(unknown_name(f"capability of {agent}", capability, cards))
        chosen = [cards[capability]] if capability is not None else list(cards.values())
        if as_json:
            _print_json(
                {
                    "role": card.role,
                    "version": card.version,
                    "tools": card.tools,
                    "planner": card.planner,
                    "model": card.model,
                    "capabilities": [
                        {
                            "name": c.name,
                            "version": c.version,
                            "request_schema": json.loads(c.request_schema),
                            "response_schema": json.loads(c.response_schema),
                        }
                        for c in chosen
                    ],
                }
            )
            return
        if capability is None:
            console.print(f"[bold]{card.role}[/] {card.version}", highlight=False)
            if card.model:  # the model its planner uses: its tier's (docs/model-planning.md)
                console.print(f"model: {card.model}", highlight=False, markup=False)
            table = Table(box=None, pad_edge=False)
            for column in ("capability", "version", "request fields"):
                table.add_column(column)
            for c in chosen:
                fields = json.loads(c.request_schema).get("properties", {})
                table.add_row(c.name, c.version, ", ".join(fields))
            console.print(table)
            console.print(f"tools: {', '.join(card.tools)}", highlight=False)  # wraps: a long list
            return
        c = chosen[0]
        console.print(f"[bold]{card.role}.{c.name}[/] version {c.version}", highlight=False)
        for title, schema in (("request", c.request_schema), ("response", c.response_schema)):
            console.print(f"[bold]{title} schema[/]")
            console.print_json(schema)
