"""The client's shortcuts: fresh request ids, one multicallable per method, ids checked once."""

from __future__ import annotations

import re
from collections.abc import Callable

from stratagem.protocol import (
    AgentClient,
    ExtractEntitiesRequest,
)
from stratagem.protocol._client import _request_ids, _RequestIds
from stratagem.protocol._models import REQUEST_ID_PATTERN

Connect = Callable[..., AgentClient]
EXTRACT = ExtractEntitiesRequest(text="Mira waits in the hall.")


def test_fresh_request_ids_are_unique_and_well_formed() -> None:
    ids = [_request_ids.next() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(REQUEST_ID_PATTERN, request_id) for request_id in ids)


def test_request_ids_restart_with_another_prefix_after_a_fork() -> None:
    # ``_reset`` is what ``os.register_at_fork`` runs in a forked child.
    ids = _RequestIds()
    before = ids.next()
    ids._reset()
    after = ids.next()
    assert before.split("-")[0] != after.split("-")[0]
    assert before.endswith("-1")
    assert after.endswith("-1")
