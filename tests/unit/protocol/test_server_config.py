"""The server's small parts that need no socket: its config checks."""

from __future__ import annotations

import pytest

from stratagem.protocol import ProtocolUsageError, ServerConfig


@pytest.mark.parametrize(
    "settings",
    [{"port": 70000}, {"max_message_bytes": 0}, {"default_deadline_s": -1}, {"grace_s": -1}],
)
def test_a_bad_server_config_is_a_usage_error(settings: dict[str, float]) -> None:
    with pytest.raises(ProtocolUsageError):
        ServerConfig(**settings)  # type: ignore[arg-type]
