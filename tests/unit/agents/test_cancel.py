"""Deadlines stop work: CPU-bound work on a worker thread ends soon after its caller gives up.

Bounds are generous (seconds where the work takes milliseconds to notice): what is asserted is
that the work stops at all, where before it ran to its end (a hard search: minutes).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time

import pytest

from stratagem.agents import in_thread
from stratagem.agents._actions import search
from stratagem.protocol import Relation


def r(subject: str, predicate: str, obj: str) -> Relation:
    return Relation.model_validate({"subject": subject, "predicate": predicate, "object": obj})


def hard_world(gems: int) -> tuple[list[Relation], list[Relation]]:
    """Six rooms in a ring, ``gems`` gems to pick up, and a crown in a room no door leads to:
    the search visits every state (6 x 2^gems) before it can say no."""
    rooms = [f"room{i}" for i in range(6)]
    facts = [r("mira", "at", "room0"), r("room5", "connected", "room0")]
    facts += [r(a, "connected", b) for a, b in itertools.pairwise(rooms)]
    facts += [r(f"gem{i}", "in", rooms[i % 6]) for i in range(gems)]
    facts.append(r("crown", "in", "vault"))
    return facts, [r("mira", "has", "crown")]


def test_a_search_asked_to_stop_stops() -> None:
    facts, goals = hard_world(14)
    asked = 0

    def should_stop() -> bool:
        nonlocal asked
        asked += 1
        return asked >= 3

    outcome = search(facts, goals, max_depth=60, node_cap=10_000_000, should_stop=should_stop)
    assert outcome.stopped
    assert outcome.actions is None
    assert outcome.explored < 2_000  # a few checks of 256 states each, of 98,304


async def test_cancelling_the_caller_ends_the_thread() -> None:
    started, ended = threading.Event(), threading.Event()

    def work(*, should_stop: object) -> str:
        started.set()
        try:
            while not should_stop():  # type: ignore[operator]
                time.sleep(0.001)
            return "stopped"
        finally:
            ended.set()

    task = asyncio.create_task(in_thread(work))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(ended.wait, 5), "the worker thread kept running"


async def test_an_abandoned_hard_search_stops_and_the_next_one_is_answered() -> None:
    facts, goals = hard_world(22)  # 6 x 4M states: minutes of CPU if nothing stops it
    ended = threading.Event()

    def tracked(*, should_stop: object) -> object:
        try:
            return search(
                facts,
                goals,
                max_depth=80,
                node_cap=100_000_000,
                should_stop=should_stop,  # type: ignore[arg-type]
            )
        finally:
            ended.set()

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(in_thread(tracked), timeout=0.3)
    assert await asyncio.to_thread(ended.wait, 5), "the abandoned search kept running"
    easy_facts, easy_goals = hard_world(2)
    easy = await in_thread(functools.partial(search, easy_facts, easy_goals, max_depth=20))
    assert not easy.stopped
    assert easy.explored > 0
