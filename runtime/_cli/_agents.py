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
    JsonOpt,
    StateDirOpt,
    TimeoutOpt,
    _check_role,
    _client,
    _deployed_endpoints,
    _errors,
    _load_agents,
    _print_json,
    _run,
    _settings,
    _unknown,
    _validation_line,
    _with_agent,
    app,
    console,
    lazy_scope,
)
from stratagem.runtime._input import (
    InputError,
    parse_json_object,
)

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.table import Table

    from stratagem.agents import ExtensionError, import_extensions
    from stratagem.protocol import CAPABILITIES, AgentCard, capability_for

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


# -- one request ---------------------------------------------------------------------------------


@app.command()
def request(
    agent: Annotated[str, typer.Argument(help="Target agent role.")],
    capability: Annotated[str, typer.Argument(help="Capability name, e.g. ExtractEntities.")],
    payload: Annotated[str, typer.Option("--json", help="The request as a JSON object.")] = "{}",
    caller: Annotated[
        str,
        typer.Option("--as", help="Caller identity (trusted until identity authentication lands)."),
    ] = _OPERATOR,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
    timeout: TimeoutOpt = None,
) -> None:
    """Send one cross-agent request and print the answer as JSON."""
    with _errors():
        settings = _settings(address, state_dir)
        if settings.extensions:  # they may register capabilities this command must encode
            _load_agents()
            try:
                import_extensions(settings.extensions)
            except ExtensionError as exc:
                raise InputError(str(exc)) from exc
        _check_role(agent)
        spec = capability_for(agent, capability)
        if spec is None:
            served = [name for name, item in CAPABILITIES.items() if item.role == agent]
            raise InputError(
                f"agent {agent!r} has no capability {capability!r}; valid: {', '.join(served)}"
            )
        raw = parse_json_object(payload, "--json")
        try:
            body = spec.request.model_validate(raw)
        except ValidationError as exc:
            raise InputError(_validation_line(f"{capability} request", exc)) from exc
        # One request id whichever way the call goes: a repeat gets the stored answer.
        request_id = f"cli-{uuid.uuid4().hex}"
        answer = _with_agent(
            settings,
            agent,
            caller,
            timeout,
            lambda client: client.call(agent, capability, body, request_id=request_id),
        )
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
    """What an agent serves: capabilities, versions, schemas, tools (the Describe RPC)."""
    with _errors():
        _check_role(agent)
        settings = _settings(address, state_dir)
        endpoint = _deployed_endpoints(settings)[agent]

        async def ask() -> AgentCard:
            async with _client(settings, endpoint) as client:
                return await client.describe()

        card = _run(ask)
        cards = {c.name: c for c in card.capabilities}
        if capability is not None and capability not in cards:
            raise InputError(_unknown(f"capability of {agent}", capability, cards))
        chosen = [cards[capability]] if capability is not None else list(cards.values())
        if as_json:
            _print_json(
                {
                    "role": card.role,
                    "version": card.version,
                    "tools": card.tools,
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
            table = Table(box=None, pad_edge=False)
            for column in ("capability", "version", "request fields"):
                table.add_column(column)
            for c in chosen:
                fields = json.loads(c.request_schema).get("properties", {})
                table.add_row(c.name, c.version, ", ".join(fields))
            console.print(table)
            console.print(f"tools: {', '.join(card.tools)}", highlight=False, soft_wrap=True)
            return
        c = chosen[0]
        console.print(f"[bold]{card.role}.{c.name}[/] version {c.version}", highlight=False)
        for title, schema in (("request", c.request_schema), ("response", c.response_schema)):
            console.print(f"[bold]{title} schema[/]")
            console.print_json(schema)
