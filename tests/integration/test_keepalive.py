"""A call that sends no data for a long time survives the client's keepalive pings."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from stratagem.protocol._rpc import KEEPALIVE_OPTIONS, SERVER_KEEPALIVE_OPTIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUIET_S = 45.0


async def test_a_quiet_call_outlives_the_clients_pings() -> None:
    # The client pings every 10 s while a call is open; a server that allows pings without data
    # only every 5 minutes (gRPC's default: what an option key it does not know leaves) counts
    # them as strikes and ends the call with GOAWAY "too_many_pings" after about 30 s.
    async def slow(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(QUIET_S)
        return request

    server = grpc.aio.server(options=list(SERVER_KEEPALIVE_OPTIONS))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Quiet", {"Slow": grpc.unary_unary_rpc_method_handler(slow)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=list(KEEPALIVE_OPTIONS)
        ) as channel:
            answer = await channel.unary_unary("/test.Quiet/Slow")(b"still here", timeout=90)
        assert answer == b"still here"
    finally:
        await server.stop(0)
