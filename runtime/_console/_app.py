"""The console's ASGI application: Starlette routes over the operator API, Jinja2 templates
(autoescaped: a goal or an output holding HTML is shown as text), the session guard.

``_routes.console_app(config)`` builds it; the ``Operator`` it reads through is opened on the
server's event loop when the app starts and closed when it stops. Every route but ``/login`` and
the static files needs a session: pages answer 401 with a page saying how to sign in, ``/api/``
answers 401 with JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stratagem.protocol import OPERATOR
from stratagem.runtime._console._assets import Assets
from stratagem.runtime._console._auth import Session, Sessions
from stratagem.runtime._console._data import ConsoleData
from stratagem.runtime._console._status import StatusCache
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.operator._operator import Directory, Operator

__all__ = ["Console", "ConsoleConfig", "LiveStreams", "SessionGuard"]

logger = logging.getLogger(__name__)

TEMPLATES: Final = Path(__file__).resolve().parent / "templates"
OPEN_PATHS: Final = ("/login", "/static/", "/favicon.ico")
"""What a browser may ask for without a session."""


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """How the console runs.

    Attributes:
        settings: The deployment's settings (as the CLI reads them).
        secure_cookie: Mark the session cookie ``Secure`` (served over TLS).
        cookie_name: The session cookie's name (the port makes two consoles on one host apart).
        endpoints: The agents' endpoints when known (else found as the operator API finds them).
        directory: Where endpoints come from when the published ones do not serve.
        timeout_s: The deadline of the console's calls to the agents.
        max_live: Live streams (``/live``) the console keeps open at once, all sessions
            together; each holds one ``Watch`` stream on the plan's agent, so this keeps the
            agents' ``STRATAGEM_MAX_WATCH_STREAMS`` slots (1024 each) for others.
        max_live_per_session: Live streams one session keeps open at once (its tabs).
    """

    settings: Settings
    secure_cookie: bool = False
    cookie_name: str = "stratagem_console"
    endpoints: dict[str, str] | None = None
    directory: Directory | None = None
    timeout_s: float | None = None
    max_live: int = 128
    max_live_per_session: int = 16


class LiveStreams:
    """The live streams open, per session: a slot is taken before a stream opens its ``Watch``
    and given back when it ends (each slot once)."""

    def __init__(self, limit: int, per_session: int) -> None:
        self.limit = limit
        self.per_session = per_session
        self._open: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(self._open.values())

    def take(self, session_id: str) -> Callable[[], None] | str:
        """A slot's release (call it once the stream ends), or why there is none."""
        mine = self._open.get(session_id, 0)
        if mine >= self.per_session:
            return (
                f"this session has {mine} live streams open, the most one session may; "
                "close a plan's page to open another"
            )
        if len(self) >= self.limit:
            return (
                f"the console has {self.limit} live streams open, the most it keeps (each holds "
                "a Watch stream on an agent); try again when one ends"
            )
        self._open[session_id] = mine + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.get(session_id, 0) - 1
            if left > 0:
                self._open[session_id] = left
            else:
                self._open.pop(session_id, None)

        return release


@dataclass(slots=True)
class Console:
    """What the routes share: the config, the sessions, the templates, the operator API."""

    config: ConsoleConfig
    sessions: Sessions = field(default_factory=Sessions)
    assets: Assets = field(default_factory=Assets.find)
    templates: jinja2.Environment = field(init=False)
    live: LiveStreams = field(init=False)
    _data: ConsoleData | None = None
    _status: StatusCache | None = None

    def __post_init__(self) -> None:
        self.live = LiveStreams(self.config.max_live, self.config.max_live_per_session)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,  # every template is HTML: nothing a plan holds is markup
            undefined=jinja2.StrictUndefined,
            auto_reload=False,
        )
        self.templates.filters["dom_id"] = dom_id
        self.templates.filters["clock"] = clock
        self.templates.filters["pretty"] = pretty
        self.templates.globals["asset_problem"] = self.assets.problem()

    @property
    def data(self) -> ConsoleData:
        """The operator API's reads (once the app started)."""
        if self._data is None:
            raise RuntimeError("the console's app has not started")
        return self._data

    @property
    def status(self) -> StatusCache:
        """How the agents are doing (once the app started)."""
        if self._status is None:
            self._status = StatusCache(self.data.operator)
        return self._status

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The operator API, open while the app serves."""
        operator = Operator(
            settings=self.config.settings,
            caller=OPERATOR,
            timeout_s=self.config.timeout_s,
            endpoints=self.config.endpoints,
            directory=self.config.directory,
        )
        self._data = ConsoleData(operator)
        try:
            yield
        finally:
            self._data = None
            self._status = None
            await operator.aclose()

    def page(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        """``template`` rendered with the request's session and ``context``."""
        session: Session | None = request.scope.get("session_record")
        body = self.templates.get_template(template).render(
            request=request,
            csrf_token=session.csrf_token if session else "",
            signed_in=session is not None,
            **context,
        )
        return HTMLResponse(body, status_code=status_code, headers=_NO_STORE)

    def fragment(self, template: str, **context: Any) -> str:
        """A template rendered without the page around it (for htmx and the live stream)."""
        return self.templates.get_template(template).render(**context)


_NO_STORE: Final = {"Cache-Control": "no-store"}

SECURITY_HEADERS: Final = [
    # Scripts only from the console itself (Mermaid needs inline styles in its SVG).
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        b"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        b"form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def dom_id(*parts: str) -> str:
    """An element id for a plan (and step): any id is safe in HTML and in a CSS selector."""
    return "x" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def clock(moment: datetime | float | None) -> str:
    """A wall-clock time (a datetime or epoch seconds), as the page shows it: UTC, to the
    millisecond."""
    if not moment:
        return ""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def pretty(value: Any) -> str:
    """A step's input or output as indented JSON (``—`` for none); the template escapes it."""
    if value is None:
        return "—"
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


class SessionGuard:
    """Lets a request through only with a live session cookie (``OPEN_PATHS`` aside), and adds
    the security headers to every answer.

    Pure ASGI (not ``BaseHTTPMiddleware``): the live stream passes through unbuffered.
    """

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        path: str = scope["path"]
        if path.startswith(OPEN_PATHS):
            await self.app(scope, receive, secured)
            return
        request = Request(scope)
        session = self.console.sessions.session(
            request.cookies.get(self.console.config.cookie_name)
        )
        if session is None:
            response: Response
            if path.startswith("/api/"):
                response = JSONResponse(
                    {"error": "not signed in: open the login URL 'stratagem console' printed"},
                    status_code=401,
                )
            else:
                response = self.console.page(request, "signin.html", status_code=401)
            await response(scope, receive, secured)
            return
        scope["session_record"] = session
        await self.app(scope, receive, secured)
