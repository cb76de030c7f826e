"""The console's routes: which page, fragment, API call or static file answers each path, and the
ASGI app that serves them (``console_app``). It sits over the pages (``_pages``), the API
(``_api``) and the shared state (``_app``), none of which imports it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from stratagem.runtime._console import _api, _artifacts, _memory, _pages
from stratagem.runtime._console._app import Console, ConsoleConfig, SessionGuard
from stratagem.runtime._console._assets import STATIC

__all__ = ["console_app"]


def console_app(config: ConsoleConfig, console: Console | None = None) -> Starlette:
    """The console's ASGI app for the deployment ``config`` names.

    Args:
        config: How it runs.
        console: Its shared state (made from ``config`` when ``None``; a caller that prints the
            login URL makes it first, to mint the token).
    """
    console = console or Console(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with console.running():
            yield

    routes = [
        Route("/login", _pages.login, methods=["GET"]),
        Route("/logout", _pages.logout, methods=["POST"]),
        Route("/", _pages.home, methods=["GET"]),
        Route("/plans", _pages.plans, methods=["GET"]),
        Route("/plans/{plan_id:path}", _pages.plan, methods=["GET"]),
        Route("/fragments/plan/{plan_id:path}", _pages.plan_body, methods=["GET"]),
        Route("/fragments/trace/{trace_id}", _pages.trace, methods=["GET"]),
        Route("/fragments/status", _pages.status, methods=["GET"]),
        Route("/live/{plan_id:path}", _pages.live, methods=["GET"]),
        Route("/gates", _pages.gates, methods=["GET"]),
        Route("/actions/{action}", _pages.action, methods=["POST"]),
        Route("/agents", _pages.agents, methods=["GET"]),
        Route("/agents/{role}", _pages.agent, methods=["GET"]),
        Route("/audit", _pages.audit, methods=["GET"]),
        Route("/knowledge", _pages.knowledge, methods=["GET"]),
        Route("/knowledge/{claim_id}", _pages.claim, methods=["GET"]),
        Route("/hypotheses", _pages.hypotheses, methods=["GET"]),
        Route("/hypotheses/{investigation}", _pages.investigation, methods=["GET"]),
        Route("/memory", _memory.memory, methods=["GET"]),
        Route("/artifacts", _artifacts.artifacts, methods=["GET"]),
        Route("/artifacts/show", _artifacts.artifact, methods=["GET"]),
        Route("/artifacts/raw", _artifacts.artifact_raw, methods=["GET"]),
        Route("/api/session", _api.session, methods=["GET"]),
        Route("/api/plans", _api.plans, methods=["GET"]),
        Route("/api/plans/{plan_id:path}", _api.plan, methods=["GET"]),
        Route("/api/gates", _api.gates, methods=["GET"]),
        Route("/api/agents", _api.agents, methods=["GET"]),
        Route("/api/audit", _api.audit, methods=["GET"]),
        Route("/api/knowledge", _api.knowledge, methods=["GET"]),
        Route("/api/knowledge/{claim_id}", _api.claim, methods=["GET"]),
        Route("/api/hypotheses", _api.hypotheses, methods=["GET"]),
        Route("/api/hypotheses/{investigation}", _api.hypotheses, methods=["GET"]),
        Route("/api/memory", _memory.memory_api, methods=["GET"]),
        Route("/api/actions/{action}", _api.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.console = console
    app.state.started = time.time()
    app.add_middleware(SessionGuard, console=console)
    app.add_exception_handler(404, _pages.not_found)
    app.add_exception_handler(405, _pages.not_found)
    return app
