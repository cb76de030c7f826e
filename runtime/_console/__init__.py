"""The web console (``stratagem console``): plans, steps, gates, revisions, agents, audit and
traces in a browser, for the deployment the CLI would reach, acting as the operator through the
operator API.

Modules: ``_app`` (the ASGI app, the session guard), ``_auth`` (login tokens, sessions, CSRF),
``_data`` (the reads and actions over the operator API), ``_pages`` and ``_api`` (HTML and JSON
routes, the live stream), ``_trace`` (a trace's waterfall), ``_status`` (how the agents are
doing, asked in process through the operator API), ``_assets`` (the scripts from the npm
registry), ``_serve`` (uvicorn, the login URL, the browser).
"""

from __future__ import annotations

from stratagem.runtime._console._app import Console, ConsoleConfig
from stratagem.runtime._console._routes import console_app
from stratagem.runtime._console._serve import ConsoleServer, check_host

__all__ = ["Console", "ConsoleConfig", "ConsoleServer", "check_host", "console_app"]
