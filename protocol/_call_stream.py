"""Many ``Call``s multiplexed over one bidirectional stream (experimental, opt-in on both ends).

``proto/stratagem/v1/stream.proto`` declares the stream: a client sends ``CallFrame``s (each one
``Call``: its request id, deadline, metadata and ``AgentRequest`` bytes, or the cancellation of
one) and the server answers each with a ``CallAnswer`` naming the same call id, in the order the
calls finish. The server side (``serve_call_stream``) hands every frame to the same function a
unary ``Call`` runs (``AgentServer._run`` with the call pipeline), so each call is authenticated
from its own frame's credentials (a token's expiry checked per call), authorized, admitted, size
limited, validated, audited before its answer and traced under its own span; only the transport
differs. The client side (``CallStream``) is what ``AgentClient`` uses when
``ClientConfig.call_stream`` is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from stratagem.protocol._admission import interruption
from stratagem.protocol._errors import (
    CancelledError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    RemoteError,
    ResourceExhaustedError,
    UnavailableError,
)
from stratagem.protocol._gen.stratagem.v1 import stream_pb2
from stratagem.protocol._rpc import REQUEST_ID_KEY
from stratagem.protocol._status import from_rpc_error, from_status_message, status_message

__all__ = ["CALL_STREAM_METHOD", "CALL_STREAM_SERVICE", "CallStream", "serve_call_stream"]

logger = logging.getLogger(__name__)

CALL_STREAM_SERVICE: Final = "stratagem.v1.CallStreamService"
CALL_STREAM_METHOD: Final = f"/{CALL_STREAM_SERVICE}/CallStream"

# How long after a call's deadline the server cancels it.
_LATE_S: Final = 0.001

Run = Callable[[dict[str, str], bytes, Any], Awaitable[tuple[bytes | None, RemoteError | None]]]
"""Runs one ``Call`` through the server's pipeline: (metadata, request bytes, call context) to
(answer, error); it has settled and audited the call when it returns or is cancelled."""


class _FrameCall:
    """One call on a stream, as the pipeline asks of grpc's servicer context: its own deadline,
    the stream's peer and TLS identity."""

    __slots__ = ("_deadline", "_stream")

    def __init__(self, stream: Any, deadline: float | None) -> None:
        self._stream = stream
        self._deadline = deadline

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None  # the server's default deadline
        return self._deadline - time.monotonic()

    def peer(self) -> str:
        return str(self._stream.peer())

    def auth_context(self) -> Any:
        return self._stream.auth_context()


def _answer(
    frame: stream_pb2.CallFrame, answer: bytes | None, error: RemoteError | None
) -> stream_pb2.CallAnswer:
    message = stream_pb2.CallAnswer(request_id=frame.request_id, call_id=frame.call_id)
    if error is None:
        message.response = answer or b""
    else:
        message.status = status_message(error).SerializeToString()
    return message


def _deadline(frame: stream_pb2.CallFrame, stream: Any) -> float | None:
    """The call's deadline (``time.monotonic``): its own, cut to the stream's; ``None`` for the
    server's default."""
    now = time.monotonic()
    own: float | None = now + frame.timeout_ms / 1000 if frame.timeout_ms else None
    remaining: float | None = stream.time_remaining()
    if remaining is None:
        return own
    return now + remaining if own is None else min(own, now + remaining)


async def serve_call_stream(
    run: Run, frames: AsyncIterator[bytes], context: Any, *, max_calls: int
) -> None:
    """Serve one ``CallStream``: every frame's call through ``run``, its answer written when it
    ends (the answers ready together in one message); at most ``max_calls`` of the stream run at
    once (one more is ``RESOURCE_EXHAUSTED``).

    The stream ends once the client has half-closed it and every call has answered. A message
    that does not parse, or a frame without a call id, ends the stream with ``INVALID_ARGUMENT``
    (its calls in flight are cancelled and audited as such); so does the client going away.
    """
    answers: asyncio.Queue[stream_pb2.CallAnswer | None] = asyncio.Queue()
    running: dict[int, asyncio.Task[None]] = {}

    async def one(frame: stream_pb2.CallFrame, metadata: dict[str, str], call: Any) -> None:
        remaining = call.time_remaining()
        timer = None
        task = asyncio.current_task()
        if remaining is not None and task is not None:
            # What grpc's transport does to a unary call at its deadline: cancel it (just past
            # it, so ``interruption`` names the deadline).
            timer = asyncio.get_running_loop().call_later(remaining + _LATE_S, task.cancel)
        try:
            answer, error = await run(metadata, frame.request, call)
        except asyncio.CancelledError:
            # ``run`` has settled it (audited as cancelled or past its deadline); answer that.
            answer, error = None, interruption(call)
        finally:
            if timer is not None:
                timer.cancel()
            running.pop(frame.call_id, None)
        answers.put_nowait(_answer(frame, answer, error))

    def take(frame: stream_pb2.CallFrame) -> None:
        """Start the frame's call, cancel the call it names, or answer its refusal."""
        if not frame.call_id:
            raise InvalidArgumentError("a CallStream frame needs a call_id")
        if frame.cancel:
            task = running.get(frame.call_id)
            if task is not None:
                task.cancel()
            return
        refusal = _refusal(frame, running, max_calls)
        if refusal is not None:
            answers.put_nowait(_answer(frame, None, refusal))
            return
        metadata = dict(frame.metadata)
        if frame.request_id:
            metadata[REQUEST_ID_KEY] = frame.request_id
        call = _FrameCall(context, _deadline(frame, context))
        running[frame.call_id] = asyncio.create_task(
            one(frame, metadata, call), name=f"stratagem-call-{frame.call_id}"
        )

    async def read() -> None:
        async for data in frames:
            batch = stream_pb2.CallFrames()
            try:
                batch.ParseFromString(data)
            except Exception as exc:  # DecodeError, or a field past protobuf's own limits
                raise InvalidArgumentError("a CallStream message does not parse") from exc
            for frame in batch.frames:
                take(frame)
        while running:
            await asyncio.wait(tuple(running.values()))
        answers.put_nowait(None)

    reader = asyncio.create_task(read(), name="stratagem-call-stream-reader")
    getter: asyncio.Future[stream_pb2.CallAnswer | None] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(answers.get())
            await asyncio.wait((getter, reader), return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                reader.result()  # raises what ended the reader
                continue  # it ended the stream cleanly: its last answers are queued
            ready, ended = _ready(getter.result(), answers)
            if ready.answers:
                await context.write(ready.SerializeToString())
            if ended:
                return
    finally:
        if getter is not None and not getter.done():
            getter.cancel()
        reader.cancel()
        for task in tuple(running.values()):
            task.cancel()
        await asyncio.gather(reader, *running.values(), return_exceptions=True)


def _refusal(
    frame: stream_pb2.CallFrame, running: Mapping[int, object], max_calls: int
) -> RemoteError | None:
    """Why the frame's call is refused before any stage, if it is."""
    if frame.call_id in running:
        return InvalidArgumentError(f"call_id {frame.call_id} is still running on this stream")
    if len(running) >= max_calls:
        return ResourceExhaustedError(
            f"{max_calls} calls are running on this stream already; try again later"
        )
    named = frame.metadata.get(REQUEST_ID_KEY, frame.request_id)
    if frame.request_id and named != frame.request_id:
        return InvalidArgumentError(
            f"the frame's request_id differs from its {REQUEST_ID_KEY} metadata"
        )
    return None


def _ready(
    first: stream_pb2.CallAnswer | None, answers: asyncio.Queue[stream_pb2.CallAnswer | None]
) -> tuple[stream_pb2.CallAnswers, bool]:
    """Every answer ready now, in one message (one write, however many calls ended); and whether
    the stream's last answer is in it."""
    ready = stream_pb2.CallAnswers()
    item = first
    while item is not None:
        ready.answers.append(item)
        if answers.empty():
            break
        item = answers.get_nowait()
    return ready, item is None


class CallStream:
    """The client's end of one ``CallStream``: calls multiplexed over it, each named by a call id
    of its own, so a retry under the same request id never takes an earlier attempt's answer.

    Opened on the first call; a stream that fails (the server went away) fails the calls waiting
    on it with its status, and the next call opens a new one.

    Args:
        channel: The ``grpc.aio`` channel to the agent.
    """

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self._frames: asyncio.Queue[stream_pb2.CallFrame | None] | None = None
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None

    def _open(self) -> asyncio.Queue[stream_pb2.CallFrame | None]:
        if self._frames is None:
            frames: asyncio.Queue[stream_pb2.CallFrame | None] = asyncio.Queue()

            async def outgoing() -> AsyncIterator[bytes]:
                # Every frame queued since the last write goes in one message.
                frame = await frames.get()
                while frame is not None:
                    batch = stream_pb2.CallFrames()
                    while frame is not None:
                        batch.frames.append(frame)
                        if frames.empty():
                            break
                        frame = frames.get_nowait()
                    yield batch.SerializeToString()
                    if frame is not None:
                        frame = await frames.get()

            stream = self._channel.stream_stream(CALL_STREAM_METHOD)(
                outgoing(), wait_for_ready=False
            )
            self._frames = frames
            self._reader = asyncio.create_task(
                self._read(stream, frames), name="stratagem-call-stream"
            )
        return self._frames

    async def _read(self, stream: Any, frames: asyncio.Queue[stream_pb2.CallFrame | None]) -> None:
        failure: RemoteError = UnavailableError("the call stream ended")
        try:
            async for data in stream:
                for answer in stream_pb2.CallAnswers.FromString(data).answers:
                    waiting = self._waiting.pop(answer.call_id, None)
                    if waiting is None or waiting.done():
                        continue  # cancelled or past its deadline here already
                    if answer.status:
                        waiting.set_exception(from_status_message(answer.status))
                    else:
                        waiting.set_result(answer.response)
        except grpc.aio.AioRpcError as exc:
            failure = from_rpc_error(exc)
        except DecodeError:
            failure = InternalError("malformed answer on the call stream")
            stream.cancel()
        except asyncio.CancelledError:
            stream.cancel()
            raise
        finally:
            if self._frames is frames:
                self._frames = None
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(failure)
            self._waiting.clear()

    async def call(
        self,
        request_id: str,
        request: bytes,
        timeout_s: float,
        metadata: tuple[tuple[str, str], ...],
    ) -> bytes:
        """One ``Call`` on the stream: the ``AgentResponse`` bytes.

        Raises:
            RemoteError: The status the call answered with; ``DeadlineExceededError`` when no
                answer came within ``timeout_s`` (the server ends the call at its own deadline).
        """
        frames = self._open()
        call_id = next(self._ids)
        frame = stream_pb2.CallFrame(
            call_id=call_id,
            request_id=request_id,
            timeout_ms=max(1, round(timeout_s * 1000)),
            metadata=dict(metadata),
            request=request,
        )
        waiting: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = waiting
        frames.put_nowait(frame)
        timer = asyncio.get_running_loop().call_later(timeout_s, _expire, waiting, timeout_s)
        try:
            return await waiting
        except DeadlineExceededError:
            # The server ends the call at its own deadline (audited as such) and its late answer
            # is dropped.
            self._waiting.pop(call_id, None)
            raise
        except asyncio.CancelledError:
            if self._waiting.pop(call_id, None) is not None and self._frames is frames:
                frames.put_nowait(stream_pb2.CallFrame(call_id=call_id, cancel=True))
            raise
        finally:
            timer.cancel()

    async def aclose(self) -> None:
        """Half-close the stream and stop reading it; calls still waiting fail ``CANCELLED``."""
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(CancelledError("the client was closed"))
        self._waiting.clear()
        if self._frames is not None:
            self._frames.put_nowait(None)
            self._frames = None
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _expire(waiting: asyncio.Future[bytes], timeout_s: float) -> None:
    if not waiting.done():
        waiting.set_exception(
            DeadlineExceededError(f"no answer on the call stream within {timeout_s:.3g}s")
        )
