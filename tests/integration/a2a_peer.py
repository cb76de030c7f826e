"""A plain A2A agent made with the official ``a2a-sdk`` (no Stratagem): the remote end of the
tests in which Stratagem plans call external A2A agents.

Skill ``echo`` completes its task with one artifact holding the message's text and JSON object as
they came; skill ``fail`` fails its task with a status message; skill ``hang`` answers only once
the agent stops. The agent remembers every message id and the ``traceparent`` header each request
carried (``EchoAgent.seen``).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from starlette.applications import Starlette


@dataclass
class Seen:
    message_ids: list[str] = field(default_factory=list)
    traceparents: list[str] = field(default_factory=list)


class _Executor(AgentExecutor):
    def __init__(self, seen: Seen, stopping: asyncio.Event) -> None:
        self._seen = seen
        self._stopping = stopping

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        self._seen.message_ids.append(message.message_id)
        headers = context.call_context.state.get("headers", {})
        self._seen.traceparents.append(str(headers.get("traceparent", "")))
        task = context.current_task or new_task_from_user_message(message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        named = message.metadata.fields.get("skill")
        skill = named.string_value if named is not None else "echo"
        if skill == "fail":
            await updater.failed(new_text_message("the echo agent was asked to fail"))
            return
        if skill == "hang":
            await self._stopping.wait()
            await updater.failed(new_text_message("the echo agent stopped"))
            return
        parts = [Part(text=p.text) for p in message.parts if p.WhichOneof("content") == "text"]
        parts += [p for p in message.parts if p.WhichOneof("content") == "data"]
        await updater.add_artifact(parts, name="echo")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise RuntimeError("nothing to cancel")


class EchoAgent:
    """The agent, served by uvicorn on 127.0.0.1 (a free port) on the running loop."""

    def __init__(self, examples: dict[str, list[str]] | None = None) -> None:
        self.examples = examples or {}  # per skill: the examples its card lists
        self.seen = Seen()
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        card = AgentCard(
            name="echo",
            description="echoes each message as an artifact",
            version="1.0.0",
            supported_interfaces=[
                AgentInterface(url=self.url, protocol_binding="JSONRPC", protocol_version="1.0")
            ],
            skills=[
                AgentSkill(
                    id=skill,
                    name=skill,
                    description=description,
                    tags=["test"],
                    examples=self.examples.get(skill, []),
                )
                for skill, description in (
                    ("echo", "echoes"),
                    ("fail", "fails"),
                    ("hang", "never answers"),
                )
            ],
            capabilities=AgentCapabilities(streaming=False),
            default_input_modes=["text/plain", "application/json"],
            default_output_modes=["text/plain", "application/json"],
        )
        handler = DefaultRequestHandler(
            agent_executor=_Executor(self.seen, self._stopping),
            task_store=InMemoryTaskStore(),
            agent_card=card,
        )
        app = Starlette(
            routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
        )
        self._server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        )
        self._server.capture_signals = _no_signals  # type: ignore[method-assign]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:  # noqa: ASYNC110 (uvicorn tells it by a flag only)
            await asyncio.sleep(0.01)
        return self.url

    async def stop(self) -> None:
        self._stopping.set()  # what still hangs answers, so the server can close
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task


def _no_signals() -> object:
    import contextlib

    return contextlib.nullcontext()
