"""Turning a ``cProfile`` window into a short, JSON-ready account of where the time went.

Figures are divided by the number of requests the window served, so they read as microseconds per
request. cProfile slows pure-Python code more than C code, so the shares are indicative and the
absolute figures are higher than in an unprofiled run; the benchmark's variants give the unprofiled
attribution.
"""

from __future__ import annotations

import cProfile
import pstats
import sysconfig
from pathlib import Path
from typing import Any, Final

__all__ = ["BUILTINS", "IDLE", "profile_summary"]

IDLE: Final = "idle (event loop waiting in epoll)"
"""The group of the event loop's own wait: time the thread had nothing to run."""
BUILTINS: Final = "C code (builtins, grpc's Cython callbacks)"
"""The group of functions without Python frames; ``Context.run`` holds grpc's Cython callbacks."""

_STDLIB: Final = Path(sysconfig.get_paths()["stdlib"]).resolve()
_REPO: Final = Path(__file__).resolve().parents[2]
_WAITS: Final = ("select.epoll", "select.select", "'poll' of")
_OURS: Final = frozenset({"protocol", "planning", "agents", "runtime"})
_PACKAGES: Final = {"pydantic_core": "pydantic", "google": "protobuf"}
_STDLIB_GROUPS: Final = {
    "asyncio": "asyncio",
    "selectors": "asyncio",
    "concurrent": "thread pool (to_thread)",
    "threading": "thread pool (to_thread)",
    "queue": "thread pool (to_thread)",
}

_Key = tuple[str, int, str]


def _group(key: _Key) -> str:
    """The package (or part of the standard library) a profiled function belongs to."""
    filename, _, name = key
    if filename == "~":
        return IDLE if any(wait in name for wait in _WAITS) else BUILTINS
    if filename.startswith("<"):
        return "stdlib (other)"  # frozen modules and generated code ("<string>")
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        package = parts[parts.index("site-packages") + 1].removesuffix(".py")
        return _PACKAGES.get(package, package)
    resolved = path.resolve()
    if resolved.is_relative_to(_REPO):
        relative = resolved.relative_to(_REPO)
        group = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        return "the benchmark's own code" if group == "tests" else group
    if resolved.is_relative_to(_STDLIB):
        top = resolved.relative_to(_STDLIB).parts[0].removesuffix(".py")
        return _STDLIB_GROUPS.get(top, "stdlib (other)")
    return path.stem


def _label(key: _Key) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    if "site-packages" in parts:
        where = "/".join(parts[parts.index("site-packages") + 1 :])
    else:
        where = "/".join(parts[-2:])
    return f"{where}:{line}({name})"


def profile_summary(profiler: cProfile.Profile, requests: int, *, top: int = 12) -> dict[str, Any]:
    """Summarize a finished profile of a window that served ``requests`` requests.

    Args:
        profiler: A disabled profiler.
        requests: Requests served in the window (the divisor of every figure).
        top: How many functions to list.

    Returns:
        ``total_us`` (profiled thread time per request, idle wait included), ``by_group``
        (own time per package, µs per request, largest first), ``top_own`` (the functions with the
        most own time, idle wait excluded) and ``top_cumulative`` (Stratagem's functions with the
        most inclusive time), each entry ``{"function", "calls_per_request", "own_us",
        "cumulative_us"}``. A coroutine counts a call per resumption.
    """
    stats: dict[_Key, tuple[int, int, float, float, Any]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    per = 1e6 / max(requests, 1)
    groups: dict[str, float] = {}
    total = 0.0
    for key, (_, _, own, _, _) in stats.items():
        group = _group(key)
        groups[group] = groups.get(group, 0.0) + own
        total += own

    def entry(key: _Key) -> dict[str, Any]:
        _, calls, own, cumulative, _ = stats[key]
        return {
            "function": _label(key),
            "calls_per_request": round(calls / max(requests, 1), 2),
            "own_us": round(own * per, 1),
            "cumulative_us": round(cumulative * per, 1),
        }

    busy = [key for key in stats if _group(key) != IDLE]
    ours = [key for key in busy if _group(key) in _OURS]
    by_own = sorted(busy, key=lambda key: stats[key][2], reverse=True)[:top]
    by_cumulative = sorted(ours, key=lambda key: stats[key][3], reverse=True)[:top]
    return {
        "requests": requests,
        "total_us": round(total * per, 1),
        "by_group": {
            name: round(own * per, 1)
            for name, own in sorted(groups.items(), key=lambda item: item[1], reverse=True)
        },
        "top_own": [entry(key) for key in by_own],
        "top_cumulative": [entry(key) for key in by_cumulative],
    }
