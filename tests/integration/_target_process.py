"""A perception agent in an OS process of its own, for the target-death tests.

``python -m tests.integration._target_process SECRET_FILE`` serves the fake perception backend
with an ``AgentServer`` on 127.0.0.1 (a free port), token authentication with the cluster secret
in ``SECRET_FILE`` and the shipped policy. Every ``ExtractEntities`` handler waits on an event
that is never set, so its call stays in flight until the caller goes away or the process dies;
the other capabilities answer their samples at once.

It reports on standard output, one line per event, flushed at once:

- ``port <port>`` once it serves;
- ``started <request_id>`` when an ``ExtractEntities`` handler starts;
- ``cancelled <request_id>`` when such a handler sees ``asyncio.CancelledError``.

It serves until its standard input closes (then shuts down gracefully) or it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Final

from stratagem.protocol import (
    AgentServer,
    CallContext,
    ClusterSecret,
    InMemoryAuditLog,
    Policy,
    ServerConfig,
    TokenAuthenticator,
    TokenSigner,
    WireModel,
)
from tests.unit.protocol._support import FakeBackend

HANGING: Final = "ExtractEntities"
"""The capability whose handlers never finish on their own."""
MAX_RUNNING: Final = 256
"""Admission limit, above what the tests send, so every call runs rather than queues."""


def _say(event: str, value: object) -> None:
    sys.stdout.write(f"{event} {value}\n")
    sys.stdout.flush()


async def _serve(secret_file: Path) -> None:
    never = asyncio.Event()

    async def hang(request: WireModel, ctx: CallContext) -> WireModel:
        _say("started", ctx.request_id)
        try:
            await never.wait()
        except asyncio.CancelledError:
            _say("cancelled", ctx.request_id)
            raise
        raise AssertionError("the event is never set")

    backend = FakeBackend("perception")
    backend.behaviour[HANGING] = hang
    server = AgentServer(
        backend,
        policy=Policy.default(),
        authenticator=TokenAuthenticator(TokenSigner(ClusterSecret.load_or_create(secret_file))),
        audit=InMemoryAuditLog(),
        config=ServerConfig(
            max_concurrent_requests=MAX_RUNNING, default_deadline_s=120.0, grace_s=0.5
        ),
    )
    port = await server.start()
    _say("port", port)
    try:
        # Blocks a worker thread, not the loop, until the parent closes our stdin.
        await asyncio.to_thread(sys.stdin.read)
    finally:
        await server.aclose()


def main() -> int:
    """Serve until stdin closes; the exit status is 2 on a usage error."""
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m tests.integration._target_process SECRET_FILE\n")
        return 2
    asyncio.run(_serve(Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
