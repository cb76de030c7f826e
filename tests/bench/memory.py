"""Memory recall over 100,000 items, on SQLite and PostgreSQL (issue 35's target: p50 ≤ 20 ms).

The store holds ``items`` items spread over ``users`` namespaces ``user/u<N>``; each value is
``{"text": 12 words, "status": "open"|"done", "n": int}`` with words drawn uniformly from a
vocabulary of ``vocabulary`` made-up words (a seeded RNG). The items are written in batches by
SQL into the store's own table (the store's migrations made it; its triggers or generated column
index the text), not by 100,000 ``put`` calls; ``put`` itself is timed apart. Measured through the
store's API (``SqliteMemoryStore`` / ``PostgresMemoryStore``), each case after warm-up runs:

* ``text_all``: ``search(("user",), "w1 w2")``: two words over all 100,000 items (the target);
* ``text_one``: the same in one user's namespace (1,000 items);
* ``text_filter``: two words over all items with ``filter={"status": "open"}``;
* ``newest_filter``: no query, ``filter={"status": "open"}``: the newest matching items;
* ``get``: one item by namespace and key;
* ``put``: one write (a new key), in its own transaction.

PostgreSQL: ``STRATAGEM_TEST_PG_URL``, else ``scripts/postgres.sh``'s server; a fresh database,
dropped after.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from stratagem.agents import MemoryStore, SqliteMemoryStore
from stratagem.agents._memory._model import searchable_text
from stratagem.agents._memory._sqlite import namespace_range
from tests.bench.stats import summarize

__all__ = ["TARGET_MS", "MemoryBenchConfig", "run_memory_benchmark"]

TARGET_MS: Final = 20.0
"""Issue 35's target: recall over 100,000 items, median at most 20 ms."""
CASES: Final = ("text_all", "text_one", "text_filter", "newest_filter", "get", "put")
_REPO: Final = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class MemoryBenchConfig:
    """What the benchmark stores and how often it asks."""

    items: int = 100_000
    users: int = 100
    vocabulary: int = 5_000
    words: int = 12
    warmup: int = 10
    repeats: int = 200
    seed: int = 35
    postgres: bool = True


def _vocabulary(config: MemoryBenchConfig) -> list[str]:
    rng = random.Random(config.seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "fe"]
    words: set[str] = set()
    while len(words) < config.vocabulary:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def _rows(config: MemoryBenchConfig, words: list[str]) -> list[tuple[Any, ...]]:
    rng = random.Random(config.seed + 1)
    now = time.time() - config.items
    rows = []
    for i in range(config.items):
        key = f"item-{i}"
        value = {
            "text": " ".join(rng.choice(words) for _ in range(config.words)),
            "status": "open" if i % 2 else "done",
            "n": i,
        }
        namespace = namespace_range(("user", f"u{i % config.users}"))[0]
        text = json.dumps(value, separators=(",", ":"))
        rows.append((namespace, key, text, searchable_text(key, value), now + i, now + i))
    return rows


def _fill_sqlite(path: Path, rows: list[tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for start in range(0, len(rows), 5_000):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO memory_items (namespace, key, value, body, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows[start : start + 5_000],
            )
            conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def _fill_postgres(url: str, rows: list[tuple[Any, ...]]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        with (
            conn.cursor() as cursor,
            cursor.copy(
                "COPY stratagem.memory_items (namespace, key, value, body, created_at, updated_at) "
                "FROM STDIN"
            ) as copy,
        ):
            for row in rows:
                copy.write_row(row)
        # As autovacuum would: the GIN index's pending entries merged, the statistics taken.
        conn.execute("VACUUM ANALYZE stratagem.memory_items")


async def _time(call: Callable[[], Awaitable[Any]], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _measure(
    store: MemoryStore, fill: Callable[[], None], config: MemoryBenchConfig, words: list[str]
) -> dict[str, Any]:
    started = time.perf_counter()
    await asyncio.to_thread(fill)
    fill_s = time.perf_counter() - started
    rng = random.Random(config.seed + 2)

    def pair() -> str:
        return f"{rng.choice(words)} {rng.choice(words)}"

    hits: list[int] = []

    async def text_all() -> None:
        hits.append(len(await store.search(("user",), pair())))

    async def text_one() -> None:
        await store.search(("user", f"u{rng.randrange(config.users)}"), pair())

    async def text_filter() -> None:
        await store.search(("user",), pair(), filter={"status": "open"})

    async def newest_filter() -> None:
        await store.search(("user",), filter={"status": "open"})

    async def get() -> None:
        i = rng.randrange(config.items)
        assert await store.get(("user", f"u{i % config.users}"), f"item-{i}") is not None

    counter = iter(range(10**9))

    async def put() -> None:
        await store.put(("user", "bench"), f"new-{next(counter)}", {"text": pair()})

    calls = {
        "text_all": text_all,
        "text_one": text_one,
        "text_filter": text_filter,
        "newest_filter": newest_filter,
        "get": get,
        "put": put,
    }
    samples = {case: await _time(calls[case], config.warmup, config.repeats) for case in CASES}
    return {
        "fill_s": round(fill_s, 1),
        "mean_hits_text_all": round(sum(hits) / len(hits), 1),
        "cases_ms": {case: summarize(values) for case, values in samples.items()},
    }


def _postgres_server() -> str | None:
    import psycopg

    url = (
        os.environ.get("STRATAGEM_TEST_PG_URL")
        or subprocess.run(
            ["bash", str(_REPO / "scripts" / "postgres.sh"), "url"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
    if not url:
        return None
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error:
        return None
    return url


async def _sqlite(
    config: MemoryBenchConfig, rows: list[tuple[Any, ...]], words: list[str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stratagem-bench-memory-") as folder:
        path = Path(folder) / "memory.sqlite3"
        store = SqliteMemoryStore(path)
        await store.start()
        try:
            return await _measure(store, lambda: _fill_sqlite(path, rows), config, words)
        finally:
            await store.aclose()


async def _postgres(
    config: MemoryBenchConfig, server: str, rows: list[tuple[Any, ...]], words: list[str]
) -> dict[str, Any]:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from stratagem.agents import PostgresMemoryStore

    name = f"stratagem_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(server, dbname=name)
    store = PostgresMemoryStore(url)
    try:
        await store.start()
        return await _measure(store, lambda: _fill_postgres(url, rows), config, words)
    finally:
        await store.aclose()
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def run_memory_benchmark(config: MemoryBenchConfig | None = None) -> dict[str, Any]:
    """Measure recall (see the module docstring); the results as plain data."""
    config = config or MemoryBenchConfig()
    words = _vocabulary(config)
    rows = _rows(config, words)
    stores: dict[str, Any] = {"sqlite": asyncio.run(_sqlite(config, rows, words))}
    server = _postgres_server() if config.postgres else None
    if not config.postgres:
        stores["postgres"] = {"skipped": "not asked"}
    elif server is None:
        stores["postgres"] = {"skipped": "no PostgreSQL server (STRATAGEM_TEST_PG_URL)"}
    else:
        stores["postgres"] = asyncio.run(_postgres(config, server, rows, words))
    targets = [
        {
            "store": store,
            "case": "text_all",
            "p50_ms": figures["cases_ms"]["text_all"]["median"],
            "max_ms": TARGET_MS,
            "met": figures["cases_ms"]["text_all"]["median"] <= TARGET_MS,
        }
        for store, figures in stores.items()
        if "skipped" not in figures
    ]
    return {"config": asdict(config), "stores": stores, "targets": targets}


_CASE_NOTES: Final = {
    "text_all": "two words over all 100,000 items (target)",
    "text_one": "two words in one user's namespace (1,000 items)",
    "text_filter": "two words over all items, filter status=open",
    "newest_filter": "no query, filter status=open: the newest",
    "get": "one item by namespace and key",
    "put": "one write of a new key",
}

HEADING: Final = "## Memory: recall over 100,000 items"


def memory_section(memory: dict[str, Any] | None) -> list[str]:
    """The section of ``BENCHMARKS.md``."""
    from tests.bench.report import _table, _verdict, _wrapped

    lines = [HEADING, ""]
    if not memory:
        return [*lines, "Not measured in this run.", ""]
    if "skipped" in memory:
        return [*lines, f"Skipped: {memory['skipped']}.", ""]
    config = memory["config"]
    lines += [
        "How it was measured (`tests/bench/memory.py`): the deployment's memory store "
        f"(`SqliteMemoryStore`, `PostgresMemoryStore`) holds {config['items']:,} items in "
        f"{config['users']} namespaces `user/u<N>`, each value {config['words']} words drawn "
        f"uniformly from {config['vocabulary']:,} made-up words plus a status and a number; the "
        "items are written in batches by SQL into the store's own table (its triggers or "
        "generated column index them), then every case is asked through the store's API: "
        f"{config['warmup']} untimed runs, then {config['repeats']} timed ones; milliseconds of "
        "wall time in the calling process. Full-text recall (FTS5 BM25; PostgreSQL "
        "`ts_rank_cd` with a GIN index), no embeddings.",
        "",
    ]
    for store, figures in memory["stores"].items():
        if "skipped" in figures:
            lines += [f"{store}: skipped: {figures['skipped']}.", ""]
            continue
        rows = [
            (
                _CASE_NOTES.get(case, case),
                f"{item['median']:.2f}",
                f"{item['p99']:.2f}",
                f"{item['max']:.2f}",
            )
            for case, item in figures["cases_ms"].items()
        ]
        lines += [
            f"{store} (filled in {figures['fill_s']:.0f} s; a two-word query matched "
            f"{figures['mean_hits_text_all']:g} items on average within the limit of 10):",
            "",
        ]
        lines += _table(("case", "p50 ms", "p99 ms", "max ms"), rows, text_columns=1)
    rows = [
        (
            target["store"],
            f"{target['p50_ms']:.2f}",
            f"≤ {target['max_ms']:g}",
            _verdict(target["met"]),
        )
        for target in memory["targets"]
    ]
    lines += _table(("store", "recall p50 ms", "target ms", "verdict"), rows, text_columns=1)
    return _wrapped([*lines, ""])
