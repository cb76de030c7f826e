"""``serve_call_stream`` in one process (no sockets): the answers ready together leave in one
message, each naming its call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from stratagem.protocol._call_stream import serve_call_stream
from stratagem.protocol._errors import RemoteError
from stratagem.protocol._gen.stratagem.v1 import stream_pb2


class _Stream:
    """What ``serve_call_stream`` asks of grpc's servicer context; keeps what it writes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def time_remaining(self) -> float | None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def write(self, message: bytes) -> None:
        self.written.append(message)


async def test_answers_ready_together_are_written_in_one_message() -> None:
    async def run(
        metadata: dict[str, str], request: bytes, call: Any
    ) -> tuple[bytes | None, RemoteError | None]:
        return b"answer to " + request, None

    async def frames() -> AsyncIterator[bytes]:
        batch = stream_pb2.CallFrames(
            frames=[
                stream_pb2.CallFrame(call_id=n, request_id=f"r-{n}", request=f"{n}".encode())
                for n in (1, 2, 3)
            ]
        )
        yield batch.SerializeToString()

    stream = _Stream()
    await serve_call_stream(run, frames(), stream, max_calls=8)

    answers = [
        answer
        for message in stream.written
        for answer in stream_pb2.CallAnswers.FromString(message).answers
    ]
    assert [(a.call_id, a.request_id, a.response) for a in answers] == [
        (1, "r-1", b"answer to 1"),
        (2, "r-2", b"answer to 2"),
        (3, "r-3", b"answer to 3"),
    ]
    # One write for the three: the first answer's wake-up finds the other two queued.
    assert len(stream.written) == 1
