"""The web console's speed: with 1,000 plans stored, how fast the plans page and a 50-step plan's
page answer (median over repeated requests, the whole HTTP request through uvicorn), how soon a
live update reaches a reader of the SSE stream after the event, and whether a console watching a
plan changes the request path (one agent's call latency with and without an open live stream),
and how long the agents page takes with its status section (``/agents`` then
``/fragments/status``, nothing cached: what a browser waits for).

Targets: each page ≤ 300 ms median, a live update ≤ 500 ms after its event, the agents page with
its status ≤ 1 s median. Run alone:
``python -m tests.bench console``. The four agents are served in this process over gRPC on
127.0.0.1 with SQLite stores (``tests/integration/runtime/_served``), the console beside them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx

from stratagem.runtime._console import ConsoleConfig, ConsoleServer
from tests.bench.stats import summarize

__all__ = ["LIVE_TARGET_MS", "PAGE_TARGET_MS", "console_section", "run_console_benchmark"]

logger = logging.getLogger(__name__)

PAGE_TARGET_MS: Final = 300.0
LIVE_TARGET_MS: Final = 500.0
AGENTS_TARGET_MS: Final = 1000.0
AGENTS_RUNS: Final = 10
PLANS: Final = 1000
STEPS: Final = 50
RUNS: Final = 30


def _small(index: int) -> dict[str, Any]:
    return {
        "id": f"bench-{index:04d}",
        "owner": "strategic",
        "goal": f"benchmark plan {index}",
        "steps": [
            {
                "kind": "tool",
                "id": "summary",
                "tool": "summarize_narrative",
                "input": {"protagonist": "Mira", "themes": ["loss"], "tension": 0.5},
            }
        ],
    }


def _wide() -> dict[str, Any]:
    steps = [
        {
            "kind": "tool",
            "id": f"s{n:02d}",
            "tool": "summarize_narrative",
            "input": {"protagonist": f"hero {n}", "themes": [], "tension": 0.1},
            **({"depends_on": [f"s{n - 1:02d}"]} if n % 5 else {}),
        }
        for n in range(STEPS)
    ]
    return {"id": "bench-wide", "owner": "strategic", "goal": "fifty steps", "steps": steps}


async def _timed_get(client: httpx.AsyncClient, path: str, runs: int) -> list[float]:
    await client.get(path)  # warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        answer = await client.get(path)
        samples.append(time.perf_counter() - started)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {path} answered {answer.status_code}")
    return samples


async def _agents_page(client: httpx.AsyncClient, server: ConsoleServer, runs: int) -> list[float]:
    """The agents page and its status section, each time asked afresh (the cache dropped)."""
    samples = []
    for _ in range(runs):
        server.console._status = None  # nothing cached: what a load after the cache expired costs
        started = time.perf_counter()
        page = await client.get("/agents")
        status = await client.get("/fragments/status")
        samples.append(time.perf_counter() - started)
        if page.status_code != 200 or status.status_code != 200:
            raise RuntimeError(f"the agents page answered {page.status_code}/{status.status_code}")
    return samples


async def _call_latency(served: Any, runs: int) -> list[float]:
    samples = []
    async with served.operator() as op:
        await op.call("perception", "ExtractEntities", {"text": "Mira waits."})
        for _ in range(runs):
            started = time.perf_counter()
            await op.call("perception", "ExtractEntities", {"text": "Mira waits in the hall."})
            samples.append(time.perf_counter() - started)
    return samples


async def _measure(state: Path) -> dict[str, Any]:
    from tests.integration.runtime._served import gated_plan, serve

    served = await serve(state)
    server = ConsoleServer(ConsoleConfig(served.settings, directory=served.directory), port=0)
    await server.start()
    try:
        async with served.operator() as op:
            logger.info("console: storing %d plans and one of %d steps", PLANS, STEPS)
            for index in range(PLANS):
                await op.run_plan(_small(index))
            await op.run_plan(_wide())
        login = server.login_url()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            assert (await client.get(login.removeprefix(server.url))).status_code == 200
            plans = await _timed_get(client, "/plans", RUNS)  # goals first (folded)
            every = await _timed_get(client, "/plans?all=1", RUNS)  # every plan, as before
            wide = await _timed_get(client, "/plans/bench-wide", RUNS)
            api = await _timed_get(client, "/api/plans", RUNS)
            agents = await _agents_page(client, server, AGENTS_RUNS)
            logger.info(
                "console: plans page %.1f ms, 50-step page %.1f ms (medians)",
                statistics.median(plans) * 1e3,
                statistics.median(wide) * 1e3,
            )
            quiet = await _call_latency(served, 200)
            # A gated plan, watched live: its events after the approval are timed on arrival.
            async with served.operator() as op:
                running = asyncio.create_task(op.run_plan(gated_plan("bench-live")))
                for _ in range(400):
                    if (await op.history(status="blocked")).plans:
                        break
                    await asyncio.sleep(0.05)
                delays: list[float] = []
                watching: list[float] = []

                async def read_live() -> None:
                    async with client.stream("GET", "/live/bench-live") as stream:
                        async for line in stream.aiter_lines():
                            found = re.search(r'data-ts="([0-9.]+)"', line)
                            if found and float(found.group(1)) > approved_at:
                                delays.append(time.time() - float(found.group(1)))
                            if line.startswith("event: end"):
                                return

                approved_at = time.time() + 3600.0
                reader = asyncio.create_task(read_live())
                await asyncio.sleep(0.5)
                watching = await _call_latency(served, 200)  # while a console watches
                approved_at = time.time() - 0.001
                await op.approve("bench-live", "ok", "benchmark")
                await asyncio.wait_for(running, 60)
                await asyncio.wait_for(reader, 60)
    finally:
        await server.aclose()
        await served.stop()
    return {
        "plans_stored": PLANS + 1,
        "plans_page_ms": summarize(plans, scale=1e3),
        "plans_page_every_ms": summarize(every, scale=1e3),
        "plan_page_50_steps_ms": summarize(wide, scale=1e3),
        "api_plans_ms": summarize(api, scale=1e3),
        "agents_page_ms": summarize(agents, scale=1e3),
        "live_update_ms": summarize(delays, scale=1e3) if delays else {},
        "call_ms_without_console": summarize(quiet, scale=1e3),
        "call_ms_while_console_watches": summarize(watching, scale=1e3),
        "targets": {
            "plans_page": statistics.median(plans) * 1e3 <= PAGE_TARGET_MS,
            "plan_page": statistics.median(wide) * 1e3 <= PAGE_TARGET_MS,
            "live_update": bool(delays) and max(delays) * 1e3 <= LIVE_TARGET_MS,
            "agents_page": statistics.median(agents) * 1e3 <= AGENTS_TARGET_MS,
        },
    }


def run_console_benchmark() -> dict[str, Any]:
    """The console's section (a state directory of its own, removed after)."""
    with tempfile.TemporaryDirectory(prefix="console-bench-") as folder:
        return asyncio.run(_measure(Path(folder)))


def console_section(result: dict[str, Any] | None) -> list[str]:
    """The section of BENCHMARKS.md."""
    lines = ["## Web console", ""]
    if not result or "plans_page_ms" not in result:
        return [*lines, f"not measured: {(result or {}).get('skipped', 'no result')}", ""]
    live = result["live_update_ms"]
    agents = result.get("agents_page_ms") or {"median": "-", "p99": "-"}
    lines += [
        f"{result['plans_stored']} plans stored; medians of {RUNS} requests through uvicorn.",
        "",
        "| measure | median | p99 | target |",
        "|---|---|---|---|",
        f"| plans page | {result['plans_page_ms']['median']} ms | "
        f"{result['plans_page_ms']['p99']} ms | ≤ {PAGE_TARGET_MS:g} ms |",
        *(
            [
                f"| plans page, every plan (`all=1`) | {result['plans_page_every_ms']['median']} "
                f"ms | {result['plans_page_every_ms']['p99']} ms | ≤ {PAGE_TARGET_MS:g} ms |"
            ]
            if "plans_page_every_ms" in result
            else []
        ),
        f"| 50-step plan page | {result['plan_page_50_steps_ms']['median']} ms | "
        f"{result['plan_page_50_steps_ms']['p99']} ms | ≤ {PAGE_TARGET_MS:g} ms |",
        f"| agents page with its status | {agents['median']} ms | {agents['p99']} ms | "
        f"≤ {AGENTS_TARGET_MS:g} ms |",
        f"| live update after its event | {live.get('median', '-')} ms | "
        f"max {live.get('max', '-')} ms | ≤ {LIVE_TARGET_MS:g} ms |",
        f"| an agent call, no console | {result['call_ms_without_console']['median']} ms | "
        f"{result['call_ms_without_console']['p99']} ms | |",
        f"| an agent call, a console watching | "
        f"{result['call_ms_while_console_watches']['median']} ms | "
        f"{result['call_ms_while_console_watches']['p99']} ms | unchanged |",
        "",
    ]
    return lines
