"""``FileModelLimiter``: one queue per model server for every process of a node, in lock files
(several limiters over one folder stand for several processes: ``flock`` locks conflict between
open files even within one process)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import time
from pathlib import Path

import pytest

from stratagem.agents import TurnTimeoutError
from stratagem.runtime.host._model_slots import FileModelLimiter, slots_folder


def test_the_folder_is_per_server_under_the_state_directory(tmp_path: Path) -> None:
    one = slots_folder(tmp_path, "http://127.0.0.1:8089/v1")
    assert one == slots_folder(tmp_path, "http://127.0.0.1:8089/v1/")
    assert one != slots_folder(tmp_path, "http://127.0.0.1:9000/v1")
    assert one.parent == tmp_path / "model-slots"


async def test_limiters_over_one_folder_share_the_limit_in_order(tmp_path: Path) -> None:
    folder = slots_folder(tmp_path, "http://m/v1")
    agents = [FileModelLimiter(folder, 1) for _ in range(3)]
    holding = 0
    most = 0
    order: list[int] = []
    first_in = asyncio.Event()
    let_go = asyncio.Event()

    async def use(index: int) -> int:
        nonlocal holding, most
        async with agents[index].turn(None) as turn:
            holding += 1
            most = max(most, holding)
            order.append(index)
            if index == 0:
                first_in.set()
                await let_go.wait()
            await asyncio.sleep(0.01)
            holding -= 1
            return turn.ahead

    first = asyncio.create_task(use(0))
    await first_in.wait()
    second = asyncio.create_task(use(1))
    await asyncio.sleep(0.05)
    third = asyncio.create_task(use(2))
    await asyncio.sleep(0.05)
    let_go.set()
    aheads = await asyncio.gather(first, second, third)
    assert most == 1
    assert order == [0, 1, 2]
    assert aheads == [0, 1, 2]
    assert list(folder.glob("q-*")) == []
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


async def test_a_turn_is_not_waited_for_past_the_deadline(tmp_path: Path) -> None:
    folder = slots_folder(tmp_path, "http://m/v1")
    holder, waiter = FileModelLimiter(folder, 1), FileModelLimiter(folder, 1)
    async with holder.turn(None):
        with pytest.raises(TurnTimeoutError, match="behind 1 request"):
            async with waiter.turn(time.monotonic() + 0.05):
                pytest.fail("the turn was given while another process held it")
        assert len(list(folder.glob("q-*"))) == 1  # the waiter left the queue


async def test_an_entry_whose_process_died_does_not_keep_a_turn(tmp_path: Path) -> None:
    folder = slots_folder(tmp_path, "http://m/v1")
    folder.mkdir(parents=True)
    dead = folder / "q-00000000000000000001-999999-deadbeef"
    dead.write_text("")  # no process holds it locked
    async with FileModelLimiter(folder, 1).turn(time.monotonic() + 5) as turn:
        assert turn.ahead == 0
    assert not dead.exists()


async def test_a_live_entry_is_waited_for(tmp_path: Path) -> None:
    folder = slots_folder(tmp_path, "http://m/v1")
    folder.mkdir(parents=True)
    live = folder / "q-00000000000000000001-1-cafe"
    fd = os.open(live, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(TurnTimeoutError):
            async with FileModelLimiter(folder, 1).turn(time.monotonic() + 0.05):
                pytest.fail("a live entry's turn was taken")
    finally:
        os.close(fd)


async def test_an_abandoned_call_keeps_the_turn_until_it_settled(tmp_path: Path) -> None:
    folder = slots_folder(tmp_path, "http://m/v1")
    settled = asyncio.Event()
    async with FileModelLimiter(folder, 1).turn(None) as turn:
        turn.release_after(settled.wait())
    with pytest.raises(TurnTimeoutError):
        async with FileModelLimiter(folder, 1).turn(time.monotonic() + 0.05):
            pytest.fail("the turn was given before the abandoned call settled")
    settled.set()
    async with FileModelLimiter(folder, 1).turn(time.monotonic() + 5):
        pass
    assert list(folder.glob("q-*")) == []
