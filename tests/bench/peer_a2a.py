"""The A2A SDK (JSON-RPC over HTTP) as a benchmark peer (run with the peer's own venv, not ours).

``python peer_a2a.py serve PORT`` serves one A2A agent on 127.0.0.1:PORT (Starlette app with the
SDK's JSON-RPC routes and agent card, under uvicorn) whose executor answers each message with a
message of the same text; ``python peer_a2a.py drive PORT|URL TEXT WARMUP LATENCY THROUGHPUT
CONCURRENCY [TOKEN SKILL DATA]`` resolves the agent's card, makes the SDK's client (non-streaming
JSON-RPC) and sends ``SendMessage`` requests, printing one JSON line: the latency samples of
sequential calls (seconds) and the wall time of the closed-loop throughput phase. With TOKEN, SKILL
and DATA (a JSON object) it sends DATA as a data part asking for SKILL, with the token as a bearer
token, and expects a completed task (a Stratagem agent's A2A face). The server prints ``ready``
once it serves, and runs until it is terminated.

This file imports only the A2A SDK, its HTTP stack and the standard library: the benchmark installs
a2a-sdk[http-server] and uvicorn into a venv of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator

import httpx
import uvicorn
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_message_text, new_data_message, new_text_message
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
    TaskState,
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
    where: str,
    text: str,
    warmup: int,
    latency: int,
    throughput: int,
    concurrency: int,
    asking: tuple[str, str, str] | None = None,
) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {asking[0]}"} if asking else {}
    url = where if where.startswith("http") else f"http://127.0.0.1:{where}"
    async with httpx.AsyncClient(limits=limits, timeout=60, headers=headers) as http:
        client = await create_client(
            url, client_config=ClientConfig(streaming=False, httpx_client=http)
        )
        if asking is None:
            message = new_text_message(text, role=Role.ROLE_USER)
        else:
            message = new_data_message(json.loads(asking[2]), role=Role.ROLE_USER)
            message.metadata.update({"skill": asking[1]})

        async def call() -> None:
            # A fresh message id each call: a repeated one would be answered from the store.
            message.message_id = uuid.uuid4().hex
            answers = [
                answer async for answer in client.send_message(SendMessageRequest(message=message))
            ]
            if asking is not None:
                if answers[-1].task.status.state != TaskState.TASK_STATE_COMPLETED:
                    raise RuntimeError(f"unexpected answer {answers!r}")
            elif get_message_text(answers[-1].message) != text:
                raise RuntimeError(f"unexpected answer {answers!r}")

        await measure(call, warmup, latency, throughput, concurrency)


def main() -> None:
    role, where = sys.argv[1], sys.argv[2]
    if role == "serve":
        serve(int(where))
    elif role == "drive":
        text, *counts = sys.argv[3:8]
        warmup, latency, throughput, concurrency = (int(n) for n in counts)
        rest = sys.argv[8:]
        asking = (rest[0], rest[1], rest[2]) if len(rest) == 3 else None
        asyncio.run(drive(where, text, warmup, latency, throughput, concurrency, asking))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
