"""RefusalLimiter: per-peer budgets of individual refusal records, the rest counted."""

from __future__ import annotations

import pytest

from stratagem.protocol._refusals import RefusalLimiter, peer_address


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.5:41234", "ipv4:10.0.0.5"),
        ("ipv6:[::1]:5000", "ipv6:[::1]"),
        ("ipv6:[fe80::1%eth0]:80", "ipv6:[fe80::1%eth0]"),
        ("unix:/tmp/socket", "unix:/tmp/socket"),
    ],
)
def test_the_peer_address_drops_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_a_peer_gets_its_burst_then_is_counted_and_summarised_when_its_window_ends() -> None:
    clock = Clock()
    limiter = RefusalLimiter(burst=3, window_s=10.0, clock=clock)
    admitted = [limiter.admit("ipv4:10.0.0.5", "UNAUTHENTICATED") for _ in range(1000)]
    assert admitted.count(True) == 3
    assert admitted[:3] == [True, True, True]
    assert limiter.admit("ipv4:10.0.0.6", "UNAUTHENTICATED")  # another peer has its own budget
    assert limiter.drain() == []  # the window is still open
    clock.now += 10.0
    (summary,) = limiter.drain()
    assert (summary.peer, summary.count, summary.code) == ("ipv4:10.0.0.5", 997, "UNAUTHENTICATED")
    assert "997 more refusals" in summary.detail
    assert "ipv4:10.0.0.5" in summary.detail
    # A new window: the peer is recorded again.
    assert limiter.admit("ipv4:10.0.0.5", "UNAUTHENTICATED")


def test_codes_are_counted_apart_and_a_new_window_closes_the_old_one() -> None:
    clock = Clock()
    limiter = RefusalLimiter(burst=0, window_s=5.0, clock=clock)
    for code in ("UNAUTHENTICATED", "UNAUTHENTICATED", "INVALID_ARGUMENT"):
        assert not limiter.admit("p", code)
    clock.now += 6.0
    assert not limiter.admit("p", "UNAUTHENTICATED")  # closes the first window, opens another
    first, second = limiter.drain(everything=True)
    assert first.codes == (("UNAUTHENTICATED", 2), ("INVALID_ARGUMENT", 1))
    assert (second.count, second.code) == (1, "UNAUTHENTICATED")


def test_peers_beyond_the_limit_share_one_bucket() -> None:
    limiter = RefusalLimiter(burst=2, window_s=5.0, max_peers=2, clock=Clock())
    assert limiter.admit("a", "X")
    assert limiter.admit("b", "X")
    admitted = [limiter.admit(f"flood-{n}", "X") for n in range(100)]
    assert admitted.count(True) == 2
    summaries = {s.peer: s.count for s in limiter.drain(everything=True)}
    assert summaries == {"*": 98}


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        RefusalLimiter(burst=1, window_s=0)
