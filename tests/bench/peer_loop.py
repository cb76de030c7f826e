"""The measurement every peer driver runs (standard library only: the peers' own venvs import it
as a top-level module, from the folder of their script)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable


async def measure(
    call: Callable[[], Awaitable[None]],
    warmup: int,
    latency: int,
    throughput: int,
    concurrency: int,
) -> None:
    """Warm up, time ``latency`` sequential calls, then ``throughput`` calls by ``concurrency``
    workers; print one JSON line: ``latency`` (seconds per call), ``calls`` and ``wall_s``."""
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(latency):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    left = throughput

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall_s = time.perf_counter() - started
    print(json.dumps({"latency": samples, "calls": throughput, "wall_s": wall_s}), flush=True)
