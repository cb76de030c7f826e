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


def test_a_flood_from_many_addresses_is_bounded_for_the_agent_as_a_whole() -> None:
    # 100 loopback addresses, 10 refusals each, in one window: per address each would get its
    # burst of 10 records (1,000 in all); the agent as a whole records at most `total`.
    clock = Clock()
    limiter = RefusalLimiter(burst=10, window_s=10.0, total=40, clock=clock)
    admitted = [
        limiter.admit(f"ipv4:127.0.{n // 250}.{n % 250 + 1}", "UNAUTHENTICATED")
        for _ in range(10)
        for n in range(100)
    ]
    assert admitted.count(True) == 40
    clock.now += 10.0
    summaries = limiter.drain()
    # No address used up its own burst: one agent-wide aggregate counts all the rest.
    assert [(s.peer, s.count) for s in summaries] == [("any address, past the agent's limit,", 960)]
    assert "960 more refusals before authentication from any address" in summaries[0].detail
    # Records in the window: 40 individual ones and one aggregate, not 1,000.
    assert admitted.count(True) + len(summaries) == 41


def test_the_agent_wide_bound_defaults_to_four_bursts() -> None:
    limiter = RefusalLimiter(burst=2, window_s=5.0, clock=Clock())
    admitted = [limiter.admit(f"p{n}", "X") for n in range(20)]
    assert admitted.count(True) == 8
