"""Turns at a model server (``LocalModelLimiter``) and how the OpenAI-compatible client uses them:
a turn is waited for no longer than the caller's deadline, an abandoned call keeps its turn until
the server shows it is free, and the model's time limit is a total, not a limit per read (the real
library over httpx2's MockTransport; no socket)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from stratagem.agents import (
    ChatMessage,
    ChatRequest,
    LocalModelLimiter,
    ModelConfig,
    OpenAIModelClient,
    TurnTimeoutError,
    shared_limiter,
)
from stratagem.planning import TransientError
from stratagem.protocol import CallContext, current_call

REQUEST = ChatRequest(messages=(ChatMessage("user", "Plan."),), max_tokens=16)
URL = "http://127.0.0.1:8089/v1"


async def test_turns_are_given_first_come_first_served_within_the_limit() -> None:
    limiter = LocalModelLimiter(1)
    order: list[str] = []
    first_in = asyncio.Event()
    let_go = asyncio.Event()

    async def use(name: str, hold: asyncio.Event | None = None) -> int:
        async with limiter.turn(None) as turn:
            order.append(name)
            if hold is not None:
                first_in.set()
                await hold.wait()
            return turn.ahead

    first = asyncio.create_task(use("a", let_go))
    await first_in.wait()
    later = [asyncio.create_task(use(name)) for name in "bcd"]
    await asyncio.sleep(0)
    assert limiter.queued == 3
    let_go.set()
    aheads = await asyncio.gather(first, *later)
    assert order == ["a", "b", "c", "d"]
    assert aheads == [0, 1, 2, 3]


async def test_a_turn_is_not_waited_for_past_the_deadline() -> None:
    limiter = LocalModelLimiter(1)
    async with limiter.turn(None):
        with pytest.raises(TurnTimeoutError, match=r"behind 1 request"):
            async with limiter.turn(time.monotonic() + 0.01):
                pytest.fail("the turn was given while another held it")
        assert limiter.queued == 0
    async with limiter.turn(time.monotonic() + 5) as turn:
        assert turn.ahead == 0


async def test_an_abandoned_call_keeps_its_turn_until_it_settled() -> None:
    limiter = LocalModelLimiter(1)
    settled = asyncio.Event()
    async with limiter.turn(None) as turn:
        turn.release_after(settled.wait())
    waiting = asyncio.create_task(_take(limiter))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    settled.set()
    assert await waiting == 1


async def _take(limiter: LocalModelLimiter) -> int:
    async with limiter.turn(None) as turn:
        return turn.ahead


def test_clients_of_one_process_share_a_limiter_per_server() -> None:
    assert shared_limiter(URL, 1) is shared_limiter(URL + "/", 1)
    assert shared_limiter(URL, 1) is not shared_limiter("http://other/v1", 1)


# --- the client -----------------------------------------------------------------------------


def _chunk(text: str, finish: str | None = None) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class Server:
    """A mock server whose answers come a chunk at a time, ``interval`` apart."""

    def __init__(self, chunks: int, interval: float) -> None:
        self.chunks = chunks
        self.interval = interval
        self.seen: list[str] = []
        self.closed = 0

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request.url.path)
        if request.url.path.endswith("/models"):
            return httpx2.Response(200, json={"object": "list", "data": []})
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=self._drip()
        )

    async def _drip(self) -> AsyncIterator[bytes]:
        try:
            for _ in range(self.chunks):
                await asyncio.sleep(self.interval)
                yield _chunk("x")
            yield _chunk("", "stop")
            yield b"data: [DONE]\n\n"
        finally:
            self.closed += 1

    def client(self, timeout_s: float, limiter: LocalModelLimiter) -> OpenAIModelClient:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        config = ModelConfig(url=URL, model="m", timeout_s=timeout_s)
        return OpenAIModelClient(config, http_client=http, limiter=limiter)


async def test_the_model_timeout_is_a_total_so_a_drip_is_cut() -> None:
    # A chunk every 50 ms is never 0.3 s without a byte: a per-read limit would wait out all 200.
    server = Server(chunks=200, interval=0.05)
    client = server.client(0.3, LocalModelLimiter(1))
    with pytest.raises(TransientError, match=r"did not answer within 0.3 s .*abandoned after"):
        await client.chat(REQUEST)
    assert server.closed == 1


async def test_after_an_abandoned_call_nothing_is_sent_until_the_server_is_free() -> None:
    server = Server(chunks=200, interval=0.05)
    limiter = LocalModelLimiter(1)
    client = server.client(0.2, limiter)
    with pytest.raises(TransientError):
        await client.chat(REQUEST)
    quick = Server(chunks=1, interval=0.0)
    quick.seen = server.seen  # one log of what reached "the server"
    answer = await quick.client(5.0, limiter).chat(REQUEST)
    assert answer.content == "x"
    # The abandoned call, the probe that found the server free, and only then the next call.
    assert server.seen == ["/v1/chat/completions", "/v1/models", "/v1/chat/completions"]


async def test_a_call_is_never_sent_once_its_callers_deadline_passed_in_the_queue() -> None:
    server = Server(chunks=1, interval=0.0)
    limiter = LocalModelLimiter(1)
    client = server.client(5.0, limiter)
    caller = CallContext(
        caller="orchestrator",
        target="tactical",
        capability="PlanExecutionSequence",
        request_id="r",
        deadline=time.monotonic() + 0.05,
    )

    async def as_caller() -> Any:
        current_call.set(caller)
        return await client.chat(REQUEST)

    async with limiter.turn(None):
        with pytest.raises(TransientError, match="no turn at the model server within the call"):
            await asyncio.create_task(as_caller())
    assert server.seen == []


async def test_queue_and_abandoned_work_are_on_the_span_and_in_the_metrics() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stratagem.agents import TracedModelClient

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    server = Server(chunks=200, interval=0.05)
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(server.handle))
    inner = OpenAIModelClient(
        ModelConfig(url=URL, model="m", timeout_s=0.2),
        http_client=http,
        limiter=LocalModelLimiter(1),
        meter_provider=meters,
    )
    client = TracedModelClient(inner, tracer_provider=tracer_provider, meter_provider=meters)
    with pytest.raises(TransientError):
        await client.chat(REQUEST)
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["stratagem.model.queue.ahead"] == 0
    assert attributes["stratagem.model.abandoned"] is True
    assert attributes["stratagem.model.abandoned.reason"] == "timeout"
    assert attributes["stratagem.model.abandoned.tokens"] >= 1
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert {
        "stratagem.model.queue.wait",
        "stratagem.model.queue.length",
        "stratagem.model.abandoned",
        "stratagem.model.abandoned.duration",
    } <= set(names)
    (point,) = names["stratagem.model.abandoned"].data.data_points
    assert point.value == 1
