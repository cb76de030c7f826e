"""The server's small parts that need no socket: its config checks and its answer store."""

from __future__ import annotations

import pytest

from protocol import ProtocolUsageError, ServerConfig
from protocol._server import _AnswerCache


@pytest.mark.parametrize(
    "settings",
    [{"port": 70000}, {"max_message_bytes": 0}, {"default_deadline_s": -1}, {"grace_s": -1}],
)
def test_a_bad_server_config_is_a_usage_error(settings: dict[str, float]) -> None:
    with pytest.raises(ProtocolUsageError):
        ServerConfig(**settings)  # type: ignore[arg-type]


def test_the_answer_store_evicts_by_count_and_by_bytes() -> None:
    cache = _AnswerCache(max_entries=2, max_bytes=10)
    cache.put(("a", "1"), "d1", b"1234")
    cache.put(("a", "2"), "d2", b"1234")
    assert cache.get(("a", "1")) == ("d1", b"1234")  # now the most recently used
    cache.put(("a", "3"), "d3", b"12")
    assert cache.get(("a", "2")) is None
    cache.put(("a", "4"), "d4", b"123456")  # 4 + 2 + 6 bytes is over 10: the oldest goes
    assert cache.get(("a", "1")) is None
    assert cache.get(("a", "3")) == ("d3", b"12")
    cache.put(("a", "5"), "d5", b"x" * 11)  # larger than the whole store: not kept
    assert cache.get(("a", "5")) is None
