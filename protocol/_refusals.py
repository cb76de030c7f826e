"""Refusals before authentication, bounded per peer: what a flood can cost the audit log.

A caller without valid credentials has no identity to hold to account, and a single client can
send thousands of such calls a second; one audit record (~800 bytes) and one log line each would
let it fill the disk. ``RefusalLimiter`` therefore lets each peer address (the IP, its port
dropped) leave at most ``burst`` individual records per ``window_s``; the refusals beyond that are
still answered (``UNAUTHENTICATED`` as before, cheaply) but only counted, and when the peer's window
ends the server writes one aggregate record naming the peer, the count and the codes. So the audit
bytes an unauthenticated flood costs are bounded per peer and window, whatever its rate, and no
refusal goes uncounted.

At most ``max_peers`` addresses are tracked at once; refusals from further addresses share one
``*`` bucket with the same bound. Per address is not enough: a flood from many addresses (every
127.x.y.z is loopback) would still get ``burst`` records from each. So the agent as a whole lets
at most ``total`` refusals per window have records of their own, whichever addresses they come
from; past that every refusal is counted into one agent-wide aggregate record per window. An
unauthenticated flood thus costs the audit log at most ``total`` individual records, the
aggregates of the few addresses that used up their own burst within them (``total / burst``),
and one agent-wide aggregate, per window.

Calls that authenticated are never limited here: a denied caller with valid credentials is
accountable, and each of its refusals keeps its own record.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["RefusalLimiter", "RefusalSummary", "peer_address"]

OTHER_PEERS: Final = "*"
"""The bucket of refusals from addresses beyond ``max_peers``."""
ALL_PEERS: Final = "any address, past the agent's limit,"
"""The agent-wide bucket of refusals past ``total`` individual records in a window."""


def peer_address(peer: str) -> str:
    """The address part of a gRPC peer string: ``ipv4:10.0.0.5:41234`` -> ``ipv4:10.0.0.5``.

    ``ipv6:[::1]:5000`` -> ``ipv6:[::1]``; anything without a port (``unix:/path``) stays whole.
    """
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return f"ipv4:{rest.rpartition(':')[0] or rest}"
    if kind == "ipv6" and rest.startswith("["):
        return f"ipv6:{rest[: rest.find(']') + 1]}"
    return peer[:128]


@dataclass(slots=True)
class _Window:
    started: float
    recorded: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class RefusalSummary:
    """Refusals from one peer that were counted instead of recorded one by one.

    Attributes:
        peer: The peer address (``*`` for addresses beyond ``max_peers``).
        count: How many refusals were counted.
        codes: How many of each status code, most frequent first.
        window_s: How long the window lasted (from its first refusal to the summary), seconds.
    """

    peer: str
    count: int
    codes: tuple[tuple[str, int], ...]
    window_s: float

    @property
    def code(self) -> str:
        """The most frequent code."""
        return self.codes[0][0]

    @property
    def detail(self) -> str:
        """One line for the aggregate audit record."""
        codes = ", ".join(f"{code} {count}" for code, count in self.codes)
        return (
            f"{self.count} more refusals before authentication from {self.peer} in "
            f"{self.window_s:.1f} s, not recorded one by one: {codes}"
        )


class RefusalLimiter:
    """Decides which unauthenticated refusals get their own audit record; counts the rest.

    Args:
        burst: Individual records per peer and window.
        window_s: The window's length, seconds.
        max_peers: Peers tracked at once; further ones share the ``*`` bucket.
        total: Individual records per window for all peers together (``None``: 4 x ``burst``).
        clock: Monotonic seconds (a test passes its own).
    """

    def __init__(
        self,
        *,
        burst: int,
        window_s: float,
        max_peers: int = 1024,
        total: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        total = 4 * burst if total is None else total
        if burst < 0 or window_s <= 0 or max_peers < 1 or total < 0:
            raise ValueError("burst and total must be >= 0, window_s > 0 and max_peers >= 1")
        self._burst = burst
        self._total = total
        self._window_s = window_s
        self._max_peers = max_peers
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._overall: _Window | None = None
        self._ended: list[RefusalSummary] = []

    @property
    def window_s(self) -> float:
        """The window's length, seconds."""
        return self._window_s

    def admit(self, peer: str, code: str) -> bool:
        """Whether this refusal from ``peer`` gets its own record (else it is counted)."""
        now = self._clock()
        overall = self._overall
        if overall is not None and now - overall.started >= self._window_s:
            self._close_overall(overall, now)
            overall = None
        if overall is None:
            overall = self._overall = _Window(started=now)
        window = self._windows.get(peer)
        if window is None and len(self._windows) >= self._max_peers:
            peer = OTHER_PEERS
            window = self._windows.get(peer)
        if window is not None and now - window.started >= self._window_s:
            self._close(peer, window, now)
            window = None
        if window is None:
            window = self._windows[peer] = _Window(started=now)
        if window.recorded < self._burst:
            if overall.recorded >= self._total:
                overall.suppressed[code] += 1  # the agent's budget is spent: one count for all
                return False
            window.recorded += 1
            overall.recorded += 1
            return True
        window.suppressed[code] += 1
        return False

    def drain(self, *, everything: bool = False) -> list[RefusalSummary]:
        """Summaries of the windows that ended (all open ones too when ``everything``)."""
        now = self._clock()
        for peer, window in list(self._windows.items()):
            if everything or now - window.started >= self._window_s:
                self._close(peer, window, now)
        overall = self._overall
        if overall is not None and (everything or now - overall.started >= self._window_s):
            self._close_overall(overall, now)
        ended, self._ended = self._ended, []
        return ended

    def _close_overall(self, window: _Window, now: float) -> None:
        self._overall = None
        self._summarise(ALL_PEERS, window, now)

    def _close(self, peer: str, window: _Window, now: float) -> None:
        del self._windows[peer]
        self._summarise(peer, window, now)

    def _summarise(self, peer: str, window: _Window, now: float) -> None:
        if window.suppressed:
            self._ended.append(
                RefusalSummary(
                    peer=peer,
                    count=sum(window.suppressed.values()),
                    codes=tuple(window.suppressed.most_common()),
                    window_s=now - window.started,
                )
            )
