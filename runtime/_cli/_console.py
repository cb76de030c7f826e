"""``stratagem console``: the web console for the deployment the other commands reach."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stratagem.runtime._cli._app import (
    AddressOpt,
    StateDirOpt,
    _errors,
    _load_console,
    _settings,
    app,
    console,
    err_console,
    lazy_scope,
)
from stratagem.runtime.operator._input import InputError

if TYPE_CHECKING:
    from stratagem.runtime._console import ConsoleConfig, ConsoleServer, check_host
    from stratagem.runtime._console._assets import Assets
    from stratagem.runtime._console._serve import TlsFiles
    from stratagem.runtime.config._security import credentials_for

__all__: list[str] = []

logger = logging.getLogger(__name__)
lazy_scope(globals())


@app.command("console")
def console_command(
    port: Annotated[
        int,
        typer.Option(
            "--port", help="The port to listen on (0 picks a free one).", min=0, max=65535
        ),
    ] = 8765,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The address to listen on; one that is not loopback needs --tls-cert and "
            "--tls-key, or --allow-remote.",
        ),
    ] = "127.0.0.1",
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Print the login URL without opening a browser.")
    ] = False,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="Serve HTTPS with this certificate (PEM).")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="The certificate's private key (PEM).")
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Serve a non-loopback --host without TLS (the login token and the session "
            "cookie then cross the network in clear).",
        ),
    ] = False,
    address: AddressOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Serve the web console (plans, steps, gates, agents, audit, traces) for the deployment the
    other commands reach, and print a one-time login URL."""
    with _errors():
        _load_console()
        if (tls_cert is None) != (tls_key is None):
            raise InputError("give both --tls-cert and --tls-key, or neither")
        tls = TlsFiles(tls_cert, tls_key) if tls_cert and tls_key else None
        warning = check_host(host, tls=tls is not None, allow_remote=allow_remote)
        settings = _settings(address, state_dir)
        credentials_for(settings, "operator")  # no operator credentials: one line, exit 2
        server = ConsoleServer(
            ConsoleConfig(
                settings,
                secure_cookie=tls is not None,
                cookie_name=f"stratagem_console_{port}" if port else "stratagem_console",
            ),
            host=host,
            port=port,
            tls=tls,
        )
        server.check_tls()
        server.bind()
        if warning:
            err_console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True, highlight=False)
        missing = Assets.find().problem()
        if missing:
            err_console.print(f"[yellow]warning:[/] {missing}", soft_wrap=True, highlight=False)
        url = server.login_url()
        console.print(
            f"Stratagem console for {settings.state_dir} at {server.url}\n"
            "Sign in with this URL (it works once; restart the console for another):\n"
            f"    {url}\n"
            "Ctrl-C stops it.",
            highlight=False,
            soft_wrap=True,
        )
        console.file.flush()
        if not no_browser:
            webbrowser.open(url)

        async def serve() -> None:
            await server.start()
            try:
                await server.wait()
            finally:
                await server.aclose()

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
        err_console.print("[dim]the console stopped[/]", highlight=False)
