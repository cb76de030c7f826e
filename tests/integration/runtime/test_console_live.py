"""The console's live streams under uvicorn on a real socket: a session gets at most 16 at once
(each holds a Watch stream on an agent), the next is refused with a reason, and a client that goes
away gives its slot back (the session can open 16 again)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from stratagem.protocol import PlanEvent
from stratagem.runtime import load_settings
from stratagem.runtime._console import Console, ConsoleConfig, console_app


async def test_a_session_gets_16_live_streams_and_closed_ones_are_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(state_dir=tmp_path / "state", auth="none", address=None)
    console = Console(ConsoleConfig(settings, endpoints={}))
    server = uvicorn.Server(
        uvicorn.Config(
            console_app(console.config, console), host="127.0.0.1", port=0, log_level="error"
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(400):
            if server.started:
                break
            await asyncio.sleep(0.025)
        port = server.servers[0].sockets[0].getsockname()[1]
        watches: list[str] = []

        async def watching(plan_id: str) -> AsyncIterator[PlanEvent]:
            watches.append(plan_id)  # a Watch stream held until the client leaves
            await asyncio.Event().wait()
            yield PlanEvent(plan_id=plan_id, status="running")

        monkeypatch.setattr(console.data.operator, "watch", watching)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            signed_in = await client.get(f"/login?token={console.sessions.login_token()}")
            assert signed_in.status_code == 200
            for _ in range(2):  # the second round gets the slots the first one gave back
                streams = [
                    await client.send(client.build_request("GET", f"/live/p{n}"), stream=True)
                    for n in range(17)
                ]
                assert [s.status_code for s in streams] == [200] * 16 + [429]
                refusal = (await streams[-1].aread()).decode()
                assert "this session has 16 live streams open" in refusal
                for stream in streams:
                    await stream.aclose()
                for _ in range(400):
                    if not len(console.live):
                        break
                    await asyncio.sleep(0.025)
                assert len(console.live) == 0
        assert len(watches) == 32  # the refused ones opened no Watch
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
