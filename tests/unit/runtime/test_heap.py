"""An agent process's startup heap, frozen out of the collector's full collections (issue 37)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from stratagem.runtime.host._heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Give the test process its heap back afterwards (the permanent generation is global)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_startup_objects_leave_the_collections_and_startup_garbage_is_collected_first(
    unfrozen: None,
) -> None:
    kept = [_Node() for _ in range(1000)]  # what startup keeps
    first, second = _Node(), _Node()  # what startup dropped: a cycle only a collection frees
    first.other, second.other = second, first
    collected = weakref.ref(first)
    del first, second
    tracked = len(gc.get_objects())

    frozen = freeze_startup_heap()

    assert collected() is None  # collected before the freeze, not kept for good
    # Reference counting still frees frozen objects (another thread of the process may drop
    # some meanwhile): never more than were frozen, never fewer than startup kept.
    assert frozen >= gc.get_freeze_count() >= len(kept)
    # A full collection now traverses only what was made since: next to nothing.
    assert len(gc.get_objects()) < tracked // 10
    assert all(gc.is_tracked(node) for node in kept)  # still alive, still counted
    after = _Node()
    assert any(obj is after for obj in gc.get_objects())  # new objects are collected as ever
