"""Memory stores: namespaces, JSON values, TTL, put/get/list/delete, recall, bad input.

Every test runs against each store: the in-memory fake, SQLite files and (marked ``postgres``) a
real PostgreSQL server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from stratagem.agents import (
    InMemoryMemoryStore,
    MemoryInputError,
    MemoryLimits,
    MemoryStore,
    SqliteMemoryStore,
    parse_namespace,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


StoreFactory = Callable[[Clock, MemoryLimits], MemoryStore]


def _in_memory(tmp_path: Path) -> StoreFactory:
    return lambda clock, limits: InMemoryMemoryStore(clock=clock, limits=limits)


def _sqlite(tmp_path: Path) -> StoreFactory:
    return lambda clock, limits: SqliteMemoryStore(
        tmp_path / "memory.db", clock=clock, limits=limits
    )


FACTORIES: dict[str, Callable[[Path], StoreFactory]] = {"memory": _in_memory, "sqlite": _sqlite}


@pytest.fixture(params=[*sorted(FACTORIES), pytest.param("postgres", marks=pytest.mark.postgres)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "postgres":
        # psycopg (the postgres extra) is imported only by the tests that need it.
        from stratagem.agents import PostgresMemoryStore

        url: str = request.getfixturevalue("postgres_url")
        return lambda clock, limits: PostgresMemoryStore(url, clock=clock, limits=limits)
    return FACTORIES[request.param](tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(make_store: StoreFactory, clock: Clock) -> AsyncIterator[MemoryStore]:
    opened = make_store(clock, MemoryLimits(max_value_bytes=1024))
    await opened.start()
    yield opened
    await opened.aclose()


async def test_put_get_replace_delete(store: MemoryStore, clock: Clock) -> None:
    first = await store.put(("user", "ana"), "likes", {"food": "pears", "n": 3})
    assert first.value == {"food": "pears", "n": 3}
    clock.now += 10
    second = await store.put(("user", "ana"), "likes", ["figs"])
    assert second.created_at == first.created_at
    assert second.updated_at.timestamp() == clock.now
    got = await store.get(("user", "ana"), "likes")
    assert got is not None
    assert got.value == ["figs"]
    assert got.namespace == ("user", "ana")
    assert await store.get(("user", "bo"), "likes") is None
    assert await store.delete(("user", "ana"), "likes") is True
    assert await store.delete(("user", "ana"), "likes") is False
    assert await store.get(("user", "ana"), "likes") is None


async def test_list_covers_the_namespace_and_below_only(store: MemoryStore) -> None:
    await store.put(("user", "ana"), "b", 1)
    await store.put(("user", "ana", "notes"), "a", "x")
    await store.put(("user", "anabel"), "c", 2)
    await store.put(("agent", "tactical"), "d", None)
    items = await store.list(("user", "ana"))
    assert [(item.namespace, item.key) for item in items] == [
        (("user", "ana"), "b"),
        (("user", "ana", "notes"), "a"),
    ]
    assert [item.key for item in await store.list(("user",), limit=2, offset=1)] == ["a", "c"]


async def test_ttl_expires_items(store: MemoryStore, clock: Clock) -> None:
    item = await store.put(("goal", "g1"), "draft", "soon gone", ttl_s=30)
    assert item.expires_at is not None
    assert item.expires_at.timestamp() == clock.now + 30
    await store.put(("goal", "g1"), "kept", "stays")
    clock.now += 29
    assert await store.get(("goal", "g1"), "draft") is not None
    clock.now += 2
    assert await store.get(("goal", "g1"), "draft") is None
    assert [item.key for item in await store.list(("goal",))] == ["kept"]
    assert [item.key for item in await store.search(("goal",), "gone stays")] == ["kept"]
    assert await store.sweep() == 1


async def test_search_recalls_by_text_best_first(store: MemoryStore) -> None:
    ns = ("agent", "perception")
    await store.put(ns, "harbor", {"text": "The lighthouse keeper watches the harbor at night"})
    await store.put(ns, "market", {"text": "Fish are sold in the market every morning"})
    await store.put(ns, "tower", {"text": "A lighthouse tower on the cliff", "tags": ["coast"]})
    await store.put(("agent", "other"), "x", {"text": "lighthouse elsewhere"})
    found = await store.search(ns, "lighthouse harbor")
    assert [item.key for item in found] == ["harbor", "tower"]
    assert found[0].score is not None
    assert found[1].score is not None
    assert found[0].score > found[1].score
    assert [item.key for item in await store.search(ns, "coast")] == ["tower"]
    assert await store.search(ns, "volcano") == []
    # Query syntax is words, never the database's query language.
    assert await store.search(ns, 'lighthouse" OR NOT (*') != []


async def test_search_filters_on_value_fields(store: MemoryStore, clock: Clock) -> None:
    ns = ("user", "ana")
    await store.put(ns, "t1", {"status": "open", "who": {"name": "bo"}, "n": 1, "text": "fix"})
    clock.now += 1
    await store.put(ns, "t2", {"status": "done", "who": {"name": "bo"}, "n": 1, "text": "fix"})
    clock.now += 1
    await store.put(ns, "t3", {"status": "open", "who": {"name": "cy"}, "n": True, "text": "fix"})
    await store.put(ns, "t4", "open")
    assert [i.key for i in await store.search(ns, filter={"status": "open"})] == ["t3", "t1"]
    both = await store.search(ns, "fix", filter={"who.name": "bo"})
    assert sorted(i.key for i in both) == ["t1", "t2"]
    # JSON equality: true is not 1.
    assert [i.key for i in await store.search(ns, filter={"n": 1})] == ["t2", "t1"]
    assert [i.key for i in await store.search(ns, filter={"n": True})] == ["t3"]
    assert [i.key for i in await store.search(ns, filter={"status": "open"}, limit=1)] == ["t3"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.put(("user", "ana"), 7, 1), "key"),
        (lambda s: s.put(("user", "ana"), "", 1), "key"),
        (lambda s: s.put((), "k", 1), "namespace"),
        (lambda s: s.put(("user", "a/b"), "k", 1), "namespace"),
        (lambda s: s.put(("user", "ana"), "k", "x" * 2000), "value"),
        (lambda s: s.put(("user", "ana"), "k", {1, 2}), "value"),
        (lambda s: s.put(("user", "ana"), "k", float("nan")), "value"),
        (lambda s: s.put(("user", "ana"), "k", 1, ttl_s=0), "ttl_s"),
        (lambda s: s.put(("user", "ana"), "k", 1, ttl_s=-5), "ttl_s"),
        (lambda s: s.put(("user", "ana"), "k", 1, ttl_s="10"), "ttl_s"),
        (lambda s: s.search(("user",), filter={"a b": 1}), "filter"),
        (lambda s: s.search(("user",), limit=0), "limit"),
        (lambda s: s.list(("user",), offset=-1), "offset"),
    ],
)
async def test_bad_input_names_the_field_and_writes_nothing(
    store: MemoryStore, call: Callable[[MemoryStore], object], field: str
) -> None:
    with pytest.raises(MemoryInputError) as caught:
        await call(store)  # type: ignore[misc]
    assert caught.value.field == field
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{field}: ")
    assert await store.list(("user",)) == []


def test_namespace_text_form() -> None:
    assert parse_namespace("user/ana") == ("user", "ana")
    with pytest.raises(MemoryInputError, match=r"^namespace: "):
        parse_namespace("user//ana")


async def test_sqlite_memory_survives_a_restart(tmp_path: Path) -> None:
    first = SqliteMemoryStore(tmp_path / "memory.db")
    await first.start()
    await first.put(("user", "ana"), "likes", {"text": "pears and figs"})
    await first.aclose()
    again = SqliteMemoryStore(tmp_path / "memory.db")
    await again.start()
    try:
        got = await again.get(("user", "ana"), "likes")
        assert got is not None
        assert got.value == {"text": "pears and figs"}
        assert [item.key for item in await again.search(("user",), "fig")] == ["likes"]
    finally:
        await again.aclose()


@pytest.mark.postgres
async def test_postgres_memory_survives_a_restart(postgres_url: str) -> None:
    from stratagem.agents import PostgresMemoryStore

    first = PostgresMemoryStore(postgres_url)
    await first.put(("user", "ana"), "likes", {"text": "pears and figs"})
    await first.aclose()
    again = PostgresMemoryStore(postgres_url)
    try:
        got = await again.get(("user", "ana"), "likes")
        assert got is not None
        assert got.value == {"text": "pears and figs"}
        assert [item.key for item in await again.search(("user",), "fig")] == ["likes"]
    finally:
        await again.aclose()


class ConceptEmbedder:
    """Words to concept vectors: "automobile" is near "car", far from "pear" (what full text
    cannot tell)."""

    CONCEPTS: ClassVar[dict[str, list[float]]] = {
        "car": [1.0, 0.0, 0.0],
        "automobile": [0.9, 0.1, 0.0],
        "pear": [0.0, 1.0, 0.0],
        "fruit": [0.1, 0.9, 0.0],
    }

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        vectors = []
        for text in texts:
            total = [0.0, 0.0, 0.01]
            for word in text.lower().split():
                for i, x in enumerate(self.CONCEPTS.get(word.strip(".,"), [0.0, 0.0, 0.0])):
                    total[i] += x
            vectors.append(total)
        return vectors


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def vector_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MemoryStore]:
    embedder = ConceptEmbedder()
    opened: MemoryStore
    if request.param == "memory":
        opened = InMemoryMemoryStore(embedder=embedder)
    elif request.param == "sqlite":
        opened = SqliteMemoryStore(tmp_path / "memory.db", embedder=embedder)
    else:
        from stratagem.agents import PostgresMemoryStore

        opened = PostgresMemoryStore(request.getfixturevalue("postgres_url"), embedder=embedder)
    await opened.start()
    yield opened
    await opened.aclose()


async def test_vector_recall_finds_by_meaning(vector_store: MemoryStore) -> None:
    ns = ("user", "ana")
    await vector_store.put(ns, "drive", {"text": "She parked the car", "kind": "note"})
    await vector_store.put(ns, "snack", {"text": "A ripe pear", "kind": "note"})
    await vector_store.put(ns, "other", {"text": "A red car", "kind": "todo"})
    found = await vector_store.search(ns, "automobile")
    assert [item.key for item in found][:2] in (["drive", "other"], ["other", "drive"])
    assert found[0].score is not None
    assert found[0].score > 0.9
    assert [i.key for i in await vector_store.search(ns, "fruit", limit=1)] == ["snack"]
    assert [
        i.key for i in await vector_store.search(ns, "automobile", filter={"kind": "todo"})
    ] == ["other"]


async def test_sqlite_reads_a_large_namespace_newest_first_along_the_time_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    from stratagem.agents._memory import _sqlite

    monkeypatch.setattr(_sqlite, "_SMALL_NAMESPACE", 3)  # 5 items: read along updated_at
    store = SqliteMemoryStore(tmp_path / "memory.db", clock=clock)
    await store.start()
    try:
        for i in range(5):
            clock.now += 1
            await store.put(("user", "ana"), f"k{i}", {"status": "open" if i % 2 else "done"})
        clock.now += 1
        await store.put(("user", "bo"), "k9", {"status": "open"})
        newest = await store.search(("user", "ana"), filter={"status": "open"}, limit=5)
        assert [item.key for item in newest] == ["k3", "k1"]
        assert [item.key for item in await store.search(("user",), limit=2)] == ["k9", "k4"]
    finally:
        await store.aclose()
