"""``uninterrupted``: a coroutine run at once, its rest shielded from the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from stratagem.protocol._admission import uninterrupted


async def test_a_coroutine_that_never_suspends_runs_in_the_callers_task() -> None:
    caller = asyncio.current_task()
    seen: list[asyncio.Task[object] | None] = []

    async def store() -> int:
        seen.append(asyncio.current_task())
        return 7

    assert await uninterrupted(store()) == 7
    assert seen == [caller]


async def test_a_coroutine_that_suspends_finishes_with_its_result_and_errors() -> None:
    async def slow(value: int) -> int:
        await asyncio.sleep(0)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, value)
        return await future + 1

    assert await uninterrupted(slow(1)) == 2

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("the store is gone")

    with pytest.raises(ValueError, match="the store is gone"):
        await uninterrupted(failing())


async def test_a_cancelled_caller_leaves_the_rest_running_to_its_end() -> None:
    release = asyncio.Event()
    finished: list[str] = []

    async def write() -> None:
        await release.wait()
        finished.append("written")

    caller = asyncio.ensure_future(uninterrupted(write()))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert finished == ["written"]
