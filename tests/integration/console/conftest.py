"""The console against the four real agents (gRPC on 127.0.0.1, SQLite stores and audit log,
token authentication; see ``tests/integration/runtime/_served``), served by uvicorn on a free
port, both on one event loop in a thread of their own, and a real headless Chromium (Debian's, at
``/usr/bin/chromium``) driven by Playwright from the test's thread.

Screenshots go to ``STRATAGEM_ARTIFACTS`` (default: a folder under pytest's temporary directory),
named after the test.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stratagem.protocol import SqliteAuditLog
from stratagem.runtime._console import ConsoleConfig, ConsoleServer
from tests.integration.runtime._served import Served, serve

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Running:
    """The agents and the console on their loop, and how to reach them from the test's thread."""

    served: Served
    server: ConsoleServer
    audit: SqliteAuditLog
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the agents' loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, coro: Coroutine[Any, Any, T]) -> Any:
        """Start ``coro`` on the agents' loop; its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    @property
    def url(self) -> str:
        return self.server.url

    def login_url(self) -> str:
        return self.server.login_url()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    state = tmp_path / "state"
    state.mkdir()

    async def up() -> Running:
        audit = SqliteAuditLog(state / "audit.sqlite3")
        served = await serve(state, audit=audit)
        server = ConsoleServer(
            ConsoleConfig(served.settings, directory=served.directory), host="127.0.0.1", port=0
        )
        await server.start()
        return Running(served, server, audit, loop)

    ours = asyncio.run_coroutine_threadsafe(up(), loop).result(60)
    try:
        yield ours
    finally:

        async def down() -> None:
            await ours.server.aclose()
            await ours.served.stop()
            ours.audit.close()

        asyncio.run_coroutine_threadsafe(down(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("STRATAGEM_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    folder = folder / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright (never a browser Playwright downloads)."""
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run 'make browser' (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, artifacts: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A new browser context (no cookies), its page; a screenshot of it when the test ends."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.errors = errors
    try:
        yield tab
    finally:
        tab.screenshot(path=str(artifacts / f"{request.node.name}-end.png"), full_page=True)
        context.close()
