"""Model calls traced and measured per OpenTelemetry's GenAI semantic conventions.

``TracedModelClient`` wraps any ``ModelClient``: each call is a ``chat {model}`` CLIENT span, a
child of whatever span is current (the planning agent's plan or request span, so it sits inside
the goal's one trace), with

* ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.request.max_tokens``, ``gen_ai.request.temperature``;
* ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``;
* ``error.type`` and an error status when the call fails;
* the messages and the answer (``gen_ai.input.messages``, ``gen_ai.output.messages``) only when
  ``capture_content`` is on (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, read by
  the runtime): prompts hold the user's text.

and two metrics: ``gen_ai.client.token.usage`` (a histogram of tokens per call, by
``gen_ai.token.type`` ``input``/``output``) and ``gen_ai.client.operation.duration`` (seconds).
Nothing here sees the API key: it stays inside the wrapped client.
"""

from __future__ import annotations

import json
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from stratagem.agents._model import ChatRequest, ChatResponse, ModelClient

__all__ = ["TracedModelClient"]

_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)


class TracedModelClient:
    """A ``ModelClient`` whose calls leave GenAI spans and metrics.

    Args:
        client: The model client to trace.
        provider: ``gen_ai.provider.name``: ``openai`` for any OpenAI-compatible server.
        tracer_provider: Where spans go (the global provider when ``None``).
        meter_provider: Where metrics go (the global provider when ``None``).
        capture_content: Whether messages and answers go on the span.
    """

    def __init__(
        self,
        client: ModelClient,
        *,
        provider: str = "openai",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
    ) -> None:
        self._client = client
        self._provider = provider
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        meter = get_meter(__name__, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens used per model call, by type",
            explicit_bucket_boundaries_advisory=list(_TOKEN_BUCKETS),
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of model calls",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self._capture = capture_content

    def __repr__(self) -> str:
        return f"TracedModelClient({self._client!r})"

    @property
    def model(self) -> str:
        return self._client.model

    async def chat(self, request: ChatRequest) -> ChatResponse:
        model = self._client.model
        common: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": model,
        }
        attributes: dict[str, Any] = {
            **common,
            "gen_ai.request.max_tokens": request.max_tokens,
            "gen_ai.request.temperature": request.temperature,
            "gen_ai.output.type": "json" if request.schema is not None else "text",
        }
        if self._capture:
            attributes["gen_ai.input.messages"] = json.dumps(
                [
                    {"role": m.role, "parts": [{"type": "text", "content": m.content}]}
                    for m in request.messages
                ]
            )
        started = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await self._client.chat(request)
            except BaseException as exc:
                error = type(exc).__name__
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR, str(exc)[:300]))
                self._duration.record(
                    time.perf_counter() - started, {**common, "error.type": error}
                )
                raise
            span.set_attributes(
                {
                    "gen_ai.response.model": response.model,
                    "gen_ai.response.finish_reasons": [response.finish_reason],
                    "gen_ai.usage.input_tokens": response.input_tokens,
                    "gen_ai.usage.output_tokens": response.output_tokens,
                }
            )
            if self._capture:
                span.set_attribute(
                    "gen_ai.output.messages",
                    json.dumps(
                        [
                            {
                                "role": "assistant",
                                "parts": [{"type": "text", "content": response.content}],
                                "finish_reason": response.finish_reason,
                            }
                        ]
                    ),
                )
        measured = {**common, "gen_ai.response.model": response.model}
        self._duration.record(time.perf_counter() - started, measured)
        self._tokens.record(response.input_tokens, {**measured, "gen_ai.token.type": "input"})
        self._tokens.record(response.output_tokens, {**measured, "gen_ai.token.type": "output"})
        return response
