"""AutoGen's gRPC worker runtime as a benchmark peer (run with the peer's own venv, not ours).

``python peer_autogen.py host PORT`` serves AutoGen's host service (``GrpcWorkerAgentRuntimeHost``)
on 127.0.0.1:PORT; ``python peer_autogen.py target PORT`` connects a worker runtime to it with one
``RoutedAgent`` (type ``echo``) that answers each ``Request`` with a ``Reply`` of the same text;
``python peer_autogen.py drive PORT TEXT WARMUP LATENCY THROUGHPUT CONCURRENCY`` connects a second
worker runtime and sends ``Request`` messages to that agent with ``send_message`` (worker -> host
-> worker and back, JSON payloads: AutoGen's default), printing one JSON line: the latency samples
of sequential calls (seconds) and the wall time of the closed-loop throughput phase. The servers
print ``ready`` once they serve, and run until they are terminated.

This file imports only AutoGen and the standard library: the benchmark installs autogen-core and
autogen-ext[grpc] 0.7.5 into a venv of their own (they pin other grpcio/protobuf versions).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass

from autogen_core import (
    AgentId,
    MessageContext,
    RoutedAgent,
    message_handler,
    try_get_known_serializers_for_type,
)
from autogen_ext.runtimes.grpc import GrpcWorkerAgentRuntime, GrpcWorkerAgentRuntimeHost
from peer_loop import measure  # beside this script


@dataclass
class Request:
    text: str


@dataclass
class Reply:
    text: str


class Echo(RoutedAgent):
    def __init__(self) -> None:
        super().__init__("answers each request with its text")

    @message_handler
    async def on_request(self, message: Request, ctx: MessageContext) -> Reply:
        return Reply(text=message.text)


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()


async def host(port: int) -> None:
    service = GrpcWorkerAgentRuntimeHost(address=f"127.0.0.1:{port}")
    service.start()
    try:
        await _until_terminated()
    finally:
        await service.stop()


async def target(port: int) -> None:
    runtime = GrpcWorkerAgentRuntime(host_address=f"127.0.0.1:{port}")
    # The reply's type must be known to the runtime that serializes it.
    runtime.add_message_serializer(try_get_known_serializers_for_type(Reply))
    await runtime.start()
    await Echo.register(runtime, "echo", Echo)
    try:
        await _until_terminated()
    finally:
        await runtime.stop()


async def drive(
    port: int, text: str, warmup: int, latency: int, throughput: int, concurrency: int
) -> None:
    runtime = GrpcWorkerAgentRuntime(host_address=f"127.0.0.1:{port}")
    runtime.add_message_serializer(try_get_known_serializers_for_type(Request))
    runtime.add_message_serializer(try_get_known_serializers_for_type(Reply))
    await runtime.start()
    recipient = AgentId("echo", "default")
    message = Request(text=text)

    async def call() -> None:
        reply = await runtime.send_message(message, recipient)
        if not isinstance(reply, Reply) or reply.text != text:
            raise RuntimeError(f"unexpected reply {reply!r}")

    try:
        await measure(call, warmup, latency, throughput, concurrency)
    finally:
        await runtime.stop()


def main() -> None:
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "host":
        asyncio.run(host(port))
    elif role == "target":
        asyncio.run(target(port))
    elif role == "drive":
        text, *counts = sys.argv[3:]
        warmup, latency, throughput, concurrency = (int(n) for n in counts)
        asyncio.run(drive(port, text, warmup, latency, throughput, concurrency))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
