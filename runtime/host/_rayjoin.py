"""Joining Ray (``ray.init``), with the one refusal worth a second try.

Through the Ray client (``ray://``), the cluster's client server starts a server process for each
session; when that process exits at once (the port it was given is taken, or it is starved on a
loaded node), Ray refuses the session with "Initialization failure from server" and leaves
nothing behind, so the next try gets another process and port. Every other failure to join is
reported at once, as a ``LaunchError`` naming the address.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from stratagem.runtime.host._local import LaunchError

__all__ = ["RAY_CLIENT_TRIES", "join_ray"]

logger = logging.getLogger(__name__)

RAY_CLIENT_TRIES = 3
"""How often a session the Ray client server could not start is tried."""


def join_ray(address: str | None, kwargs: dict[str, Any]) -> None:
    """``ray.init``, as a ``LaunchError`` naming the address when Ray cannot be reached.

    Through the Ray client, a session refused with "Initialization failure from server" is tried
    again (``RAY_CLIENT_TRIES`` in all, 1 s then 2 s apart): the refusal is the client server
    failing to start a process for this session, and Ray has left nothing behind after it.
    Any other failure, or the last refusal, is reported at once.
    """
    for attempt in range(1, RAY_CLIENT_TRIES + 1):
        try:
            ray.init(address=address, **kwargs)
            return
        except (ConnectionError, RuntimeError, ValueError) as exc:
            transient = (
                (address or "").startswith("ray://")
                and isinstance(exc, ConnectionAbortedError)
                and "Initialization failure from server" in str(exc)
            )
            if not transient or attempt == RAY_CLIENT_TRIES:
                raise LaunchError(f"cannot reach Ray at {address}: {exc}") from exc
            logger.warning(
                "the Ray client server at %s could not start this session (try %d of %d); "
                "trying again",
                address,
                attempt,
                RAY_CLIENT_TRIES,
            )
            time.sleep(float(attempt))
