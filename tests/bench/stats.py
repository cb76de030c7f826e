"""Small statistics helpers shared by the benchmarks: medians, percentiles, summaries."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["closed_loop", "percentile", "summarize"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``samples`` by the nearest-rank method.

    Args:
        samples: At least one value, in any order.
        q: The percentile, in ``(0, 100]``.

    Returns:
        The smallest sample such that at least ``q`` percent of the samples are at or below it.

    Raises:
        ValueError: When ``samples`` is empty or ``q`` is out of range.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"percentile must be in (0, 100], not {q}")
    ordered = sorted(samples)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[rank - 1]


def summarize(samples: Sequence[float], *, scale: float = 1.0, digits: int = 2) -> dict[str, float]:
    """Median, p99, minimum, maximum and mean of ``samples``, each multiplied by ``scale``.

    Args:
        samples: At least one value.
        scale: Unit conversion, e.g. ``1e6`` for seconds to microseconds.
        digits: Rounding of the results.

    Returns:
        ``{"median", "p99", "min", "max", "mean", "n"}``.
    """
    return {
        "median": round(statistics.median(samples) * scale, digits),
        "p99": round(percentile(samples, 99) * scale, digits),
        "min": round(min(samples) * scale, digits),
        "max": round(max(samples) * scale, digits),
        "mean": round(statistics.fmean(samples) * scale, digits),
        "n": len(samples),
    }


async def closed_loop(
    call: Callable[[], Awaitable[object]], calls: int, concurrency: int
) -> tuple[float, list[float]]:
    """``calls`` calls by ``concurrency`` workers, each starting its next call at once: the wall
    time (seconds) and each call's latency (seconds)."""
    left = calls
    samples: list[float] = []

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, samples
