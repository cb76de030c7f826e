"""Serving the console: uvicorn on a socket bound here (so the port is known before the login URL
is printed), loopback unless told otherwise, TLS when given a certificate."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from stratagem.runtime._console._app import Console, ConsoleConfig
from stratagem.runtime._console._routes import console_app
from stratagem.runtime.operator._input import InputError

__all__ = ["ConsoleServer", "check_host"]

logger = logging.getLogger(__name__)

GRACE_S = 2.0
"""How long open pages' live streams are given when the console stops."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, *, tls: bool, allow_remote: bool) -> str:
    """Whether the console may listen on ``host``: loopback always; another address only with
    TLS or ``allow_remote`` (the caller's explicit flag).

    Returns:
        A warning to print (``""`` for none).

    Raises:
        InputError: Another address without TLS or the flag.
    """
    if _loopback(host):
        return ""
    if not tls and not allow_remote:
        raise InputError(
            f"--host {host} is not a loopback address: anyone who reaches it could try the "
            "console; give --tls-cert and --tls-key, or --allow-remote to serve it in clear"
        )
    if not tls:
        return (
            f"serving on {host} without TLS: the login token and the session cookie cross the "
            "network in clear; whoever reads them acts as the operator"
        )
    return f"serving on {host} (TLS): every agent is reachable as the operator from there"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A certificate (chain) and its key, PEM."""

    certfile: Path
    keyfile: Path


class ConsoleServer:
    """The console on ``host:port`` (port 0: a free one), until ``aclose``.

    Args:
        config: The console's configuration.
        host: The address to listen on.
        port: The port (0 picks a free one).
        tls: Serve HTTPS with these files.
    """

    def __init__(
        self,
        config: ConsoleConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TlsFiles | None = None,
    ) -> None:
        self.console = Console(config)
        self.app = console_app(config, self.console)
        self._host = host
        self._port = port
        self._tls = tls
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    def bind(self) -> str:
        """Bind the listening socket; the console's base URL.

        Raises:
            InputError: The address cannot be bound (in use, not this machine's).
        """
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            hint = " (--port 0 picks a free one)" if self._port else ""
            raise InputError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror}{hint}"
            ) from exc
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        return self.url

    @property
    def port(self) -> int:
        """The port listened on (after ``bind``)."""
        if self._socket is None:
            return self._port
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """The console's base URL (a wildcard address shown as loopback)."""
        shown = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        if ":" in shown:
            shown = f"[{shown}]"
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{shown}:{self.port}"

    def login_url(self) -> str:
        """A new one-time login URL."""
        return f"{self.url}/login?token={self.console.sessions.login_token()}"

    def _config(self) -> uvicorn.Config:
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=int(GRACE_S),
            ssl_certfile=str(self._tls.certfile) if self._tls else None,
            ssl_keyfile=str(self._tls.keyfile) if self._tls else None,
        )
        return config

    def check_tls(self) -> None:
        """Load the TLS files once, so a bad one is one line before anything serves.

        Raises:
            InputError: A file is missing or not a certificate and its key.
        """
        if self._tls is None:
            return
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self._tls.certfile, self._tls.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(
                f"cannot use --tls-cert {self._tls.certfile} with --tls-key "
                f"{self._tls.keyfile}: {exc}"
            ) from exc

    async def start(self) -> None:
        """Serve in the background of the running loop (after ``bind``); returns once serving."""
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        server = uvicorn.Server(self._config())
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[self._socket]))
        while not server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise RuntimeError("the console stopped while starting")
            await asyncio.sleep(0.01)

    async def wait(self) -> None:
        """Until the server stops."""
        if self._task is not None:
            await self._task

    async def aclose(self) -> None:
        """Stop serving: open live streams get ``GRACE_S``, then the operator API closes."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close()
            self._socket = None
