"""The client's shortcuts: fresh request ids, one multicallable per method, ids checked once."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, get_args, get_type_hints

import pytest

from stratagem.protocol import (
    CONTROL_ACTIONS,
    AgentClient,
    ControlAction,
    ControlRequest,
    ExtractEntitiesRequest,
    ProtocolUsageError,
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


def test_control_takes_exactly_the_verbs_of_the_table() -> None:
    # The client's control is derived from protocol's ControlAction: a verb added there is one
    # the client sends (and the shortcut ``fork`` is that verb's).
    assert get_args(get_type_hints(AgentClient.control)["action"]) == CONTROL_ACTIONS
    assert set(CONTROL_ACTIONS) <= set(get_args(ControlRequest.model_fields["action"].annotation))
    assert "fork" in CONTROL_ACTIONS


@pytest.mark.parametrize(
    ("action", "given", "named"),
    [
        ("approve", {"gate_id": "g", "rationale": "ok", "value": {1, 2}}, "value"),
        ("approve", {"gate_id": "g", "rationale": "ok", "output": {"n": object()}}, "output"),
        ("approve", {"gate_id": "g", "rationale": "ok", "arguments": {"a": b"x"}}, "arguments"),
        ("fork", {"outputs": {"s": {"n": object()}}}, "outputs"),
        ("pause", {"at_step": "s"}, "at_step"),
    ],
)
async def test_control_arguments_that_do_not_fit_are_one_usage_error_naming_them(
    action: ControlAction, given: dict[str, Any], named: str
) -> None:
    # Refused before any channel opens (nothing listens at this endpoint): a value that is not
    # JSON is a ProtocolUsageError naming its argument, as a field that does not fit already was
    # (before, it escaped as json's TypeError).
    client = AgentClient("127.0.0.1:9", caller="operator")
    with pytest.raises(ProtocolUsageError, match=f"invalid {action} of plan 'p1': .*{named}"):
        await client.control("p1", action, **given)
    await client.aclose()
