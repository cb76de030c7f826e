"""The A2A SDK (JSON-RPC over HTTP) as a benchmark peer (run with the peer's own venv, not ours).

``python peer_a2a.py serve PORT`` serves one A2A agent on 127.0.0.1:PORT (Starlette app with the
SDK's JSON-RPC routes and agent card, under uvicorn) whose executor answers each message with a
message of the same text; ``python peer_a2a.py drive PORT TEXT WARMUP LATENCY THROUGHPUT
CONCURRENCY`` resolves the agent's card, makes the SDK's client (non-streaming JSON-RPC) and sends
``message/send`` requests, printing one JSON line: the latency samples of sequential calls
(seconds) and the wall time of the closed-loop throughput phase. The server prints ``ready`` once
it serves, and runs until it is terminated.

This file imports only the A2A SDK, its HTTP stack and the standard library: the benchmark installs
a2a-sdk[http-server] and uvicorn into a venv of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import httpx
import uvicorn
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_message_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    SendMessageRequest,
)
from peer_loop import measure  # beside this script
from starlette.applications import Starlette


class Echo(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message(context.get_user_input()))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise RuntimeError("nothing to cancel")


def _card(port: int) -> AgentCard:
    return AgentCard(
        name="echo",
        description="answers each message with its text",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        skills=[AgentSkill(id="echo", name="echo", description="echoes text", tags=["bench"])],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )


def serve(port: int) -> None:
    card = _card(port)
    handler = DefaultRequestHandler(
        agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        print("ready", flush=True)
        yield

    app = Starlette(
        routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")],
        lifespan=lifespan,
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def drive(
    port: int, text: str, warmup: int, latency: int, throughput: int, concurrency: int
) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        client = await create_client(
            f"http://127.0.0.1:{port}",
            client_config=ClientConfig(streaming=False, httpx_client=http),
        )
        request = SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))

        async def call() -> None:
            answers = [answer async for answer in client.send_message(request)]
            message = answers[-1].message
            if get_message_text(message) != text:
                raise RuntimeError(f"unexpected answer {answers!r}")

        await measure(call, warmup, latency, throughput, concurrency)


def main() -> None:
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "serve":
        serve(port)
    elif role == "drive":
        text, *counts = sys.argv[3:]
        warmup, latency, throughput, concurrency = (int(n) for n in counts)
        asyncio.run(drive(port, text, warmup, latency, throughput, concurrency))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
