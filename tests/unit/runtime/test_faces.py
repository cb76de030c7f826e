"""An actor's faces (``runtime.host._faces``): the settings in one shape, and the loop over a table.

No sockets: the rows here are toys, started through the same loop as ``protocol.FACES``.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from stratagem.protocol import (
    AgentBackend,
    AgentServer,
    Face,
    FaceError,
    FaceKind,
    FaceSettings,
)
from stratagem.runtime import Settings
from stratagem.runtime.host._faces import close_faces, face_settings, start_faces
from stratagem.runtime.host._mcp import McpSetupError

SERVER = cast(AgentServer, object())
BACKEND = cast(AgentBackend, object())


def test_the_settings_in_one_shape(tmp_path: Path) -> None:
    settings = Settings(
        state_dir=tmp_path,
        ports={"tactical": 5100},
        a2a_ports={"tactical": 5200},
        a2a_task_deadline_s=60.0,
        mcp_ports={"tactical": 0},
        max_message_bytes=4096,
    )
    faces = face_settings(settings, "tactical", "10.0.0.7")
    assert faces == {
        "grpc": FaceSettings(host="10.0.0.7", port=5100, max_message_bytes=4096, setting="ports"),
        "a2a": FaceSettings(port=5200, max_message_bytes=4096, task_deadline_s=60.0, setting="a2a"),
        "mcp": FaceSettings(port=0, max_message_bytes=4096, setting="mcp_ports"),
    }
    # A2A off, no MCP port for this role, mutual TLS: gRPC alone, marked mtls.
    other = Settings(state_dir=tmp_path, a2a=False, auth="mtls", grpc_host="0.0.0.0")
    assert face_settings(other, "strategic", "10.0.0.7") == {
        "grpc": FaceSettings(host="0.0.0.0", mtls=True, setting="ports")
    }


class _Toy:
    def __init__(self, name: str, log: list[str]) -> None:
        self.url = f"{name}://"
        self._name = name
        self._log = log

    async def aclose(self) -> None:
        self._log.append(f"close {self._name}")


def _row(name: str, log: list[str], fails: bool = False) -> FaceKind:
    async def start(server: AgentServer, backend: AgentBackend, settings: FaceSettings) -> Face:
        if fails:
            raise FaceError(f"{name} cannot listen on 127.0.0.1:{settings.port}")
        log.append(f"start {name}")
        return _Toy(name, log)

    return FaceKind(name, f"{name} face", start, under_mtls="skip", info_key=f"{name}_url")


async def test_the_loop_starts_the_wanted_rows_in_order_and_closes_them_in_reverse() -> None:
    log: list[str] = []
    table = [_row("one", log), _row("two", log), _row("three", log)]
    wanted = {"three": FaceSettings(), "one": FaceSettings()}
    faces = await start_faces(SERVER, BACKEND, wanted, "tactical", table)
    assert list(faces) == ["one", "three"]
    assert faces["three"].url == "three://"
    await close_faces(faces)
    assert log == ["start one", "start three", "close three", "close one"]
    assert faces == {}


async def test_a_face_left_out_by_mutual_tls_is_not_started() -> None:
    log: list[str] = []
    faces = await start_faces(
        SERVER, BACKEND, {"one": FaceSettings(mtls=True)}, "tactical", [_row("one", log)]
    )
    assert faces == {}
    assert log == []


async def test_a_face_that_cannot_start_closes_those_started_and_says_one_line() -> None:
    log: list[str] = []
    table = [_row("one", log), _row("two", log, fails=True)]
    wanted = {"one": FaceSettings(), "two": FaceSettings(port=9)}
    with pytest.raises(McpSetupError) as raised:
        await start_faces(SERVER, BACKEND, wanted, "tactical", table)
    assert str(raised.value) == "agent tactical: two cannot listen on 127.0.0.1:9"
    assert log == ["start one", "close one"]
