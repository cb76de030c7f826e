"""The artifact store: content addressing, versions, idempotent saves, digest checks on read,
bad input, retention and the sweep (real files and a real SQLite index)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stratagem.planning import (
    ARTIFACT_INDEX_BYTES_MAX,
    ArtifactCorruptError,
    ArtifactIndex,
    ArtifactInputError,
    ArtifactNotFoundError,
    ArtifactProvenance,
    ArtifactRecord,
    ArtifactRef,
    ArtifactRetention,
    ArtifactsConfig,
    ArtifactStorageError,
    ArtifactStore,
    ArtifactTooLargeError,
    FileBlobStore,
    InMemoryArtifactIndex,
    InMemoryBlobStore,
    SqliteArtifactIndex,
)
from tests.unit.planning._support import rot_artifact

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def _blob_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "blobs" / "sha256").rglob("*") if p.is_file())


FILES = ArtifactsConfig(index_bytes=0)
"""Every artifact in the blob store, however small: the tests of blob files use it (a small
artifact's bytes are otherwise kept with its record: the tests of that are below)."""


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore.open(tmp_path / "artifacts", FILES)


async def test_save_load_round_trip_with_provenance(store: ArtifactStore) -> None:
    prov = ArtifactProvenance(
        agent="tactical",
        plan_id="p1",
        revision=2,
        step_id="write",
        attempt=1,
        inputs=("a" * 64,),
        tool="artifact.save",
        tool_version="1",
    )
    record = await store.save(
        "report.md",
        b"# hi\n",
        media_type="text/markdown",
        scope="plan",
        scope_id="p1",
        provenance=prov,
    )
    assert (record.name, record.version, record.size) == ("report.md", 1, 5)
    assert record.digest == hashlib.sha256(b"# hi\n").hexdigest()
    assert record.provenance.plan_id == "p1"
    assert record.provenance.time > 0
    loaded, data = await store.load("report.md", scope="plan", scope_id="p1")
    assert data == b"# hi\n"
    assert loaded == record
    lineage = await store.provenance("report.md", scope="plan", scope_id="p1")
    assert lineage.record == record
    assert lineage.unknown_inputs == ("a" * 64,)


async def test_identical_bytes_are_stored_once_and_a_new_content_is_a_new_version(
    store: ArtifactStore, tmp_path: Path
) -> None:
    one = await store.save("a.txt", b"same", media_type="text/plain")
    two = await store.save("b.txt", b"same", media_type="text/plain")
    assert one.digest == two.digest
    assert len(_blob_files(tmp_path / "artifacts")) == 1
    again = await store.save("a.txt", b"same", media_type="text/plain")
    assert again == one  # idempotent by digest: no second version
    newer = await store.save("a.txt", b"other", media_type="text/plain")
    assert newer.version == 2
    assert [r.version for r in await store.list(name="a.txt")] == [1, 2]
    assert [r.version for r in await store.list(name="a.txt", latest=True)] == [2]
    old, data = await store.load("a.txt", version=1)
    assert data == b"same"
    assert old.version == 1


async def test_a_step_saving_again_after_a_crash_finds_its_version(store: ArtifactStore) -> None:
    prov = ArtifactProvenance(agent="tactical", plan_id="p", step_id="s", attempt=1)
    first = await store.save("x.json", b"[1]", media_type="application/json", provenance=prov)
    await store.save("x.json", b"[2]", media_type="application/json")
    rerun = ArtifactProvenance(agent="tactical", plan_id="p", step_id="s", attempt=2)
    again = await store.save("x.json", b"[1]", media_type="application/json", provenance=rerun)
    assert again == first
    assert len(await store.list(name="x.json")) == 2


async def test_records_survive_a_reopen(tmp_path: Path) -> None:
    first = ArtifactStore.open(tmp_path / "a")
    saved = await first.save("kept.txt", b"kept", media_type="text/plain")
    await first.aclose()
    second = ArtifactStore.open(tmp_path / "a")
    record, data = await second.load("kept.txt")
    assert (record, data) == (saved, b"kept")
    await second.aclose()


async def test_a_corrupted_blob_is_named_never_served(store: ArtifactStore, tmp_path: Path) -> None:
    record = await store.save("c.txt", b"precious", media_type="text/plain")
    [blob] = _blob_files(tmp_path / "artifacts")
    blob.write_bytes(b"tampered")
    with pytest.raises(ArtifactCorruptError) as err:
        await store.load("c.txt")
    assert record.digest in str(err.value)
    assert "corrupted" in str(err.value)
    assert "\n" not in str(err.value)
    blob.unlink()
    with pytest.raises(ArtifactCorruptError, match="missing"):
        await store.load("c.txt")


def test_in_memory_store_checks_digests_too() -> None:
    blobs = InMemoryBlobStore()
    index = InMemoryArtifactIndex()
    store = ArtifactStore(blobs, index, FILES)
    record = store.save_blocking("m.txt", b"memory", media_type="text/plain")
    blobs.corrupt(record.digest)
    with pytest.raises(ArtifactCorruptError):
        store.load_blocking("m.txt")
    kept = ArtifactStore(blobs, index).save_blocking("k.txt", b"kept", media_type="text/plain")
    assert not blobs.has(kept.digest)
    index.corrupt(kept.digest)
    with pytest.raises(ArtifactCorruptError, match="kept with its record"):
        store.load_blocking("k.txt")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("../etc/passwd", "slash"),
        ("a/b", "slash"),
        ("a..b", "'..'"),
        ("..", "'..'"),
        ("", "non-empty"),
        (".hidden", "starting with"),
        ("x" * 201, "1-200"),
    ],
)
async def test_bad_names_are_refused_naming_the_field(
    store: ArtifactStore, tmp_path: Path, name: str, words: str
) -> None:
    with pytest.raises(ArtifactInputError) as err:
        await store.save(name, b"x", media_type="text/plain")
    assert err.value.field == "name"
    assert words in str(err.value)
    assert str(err.value).startswith("name: ")
    assert "\n" not in str(err.value)
    assert _blob_files(tmp_path / "artifacts") == []
    assert await store.list() == []


@pytest.mark.parametrize(
    ("media_type", "data"),
    [
        ("image/png", b"not a png at all"),
        ("application/json", b"{not json"),
        ("text/plain", PNG),
        ("text/plain", b"\xff\xfe\x00binary"),
        ("application/pdf", PNG),
        ("image/jpeg", PNG),
        ("not a type", b"x"),
    ],
)
async def test_a_media_type_that_lies_is_refused(
    store: ArtifactStore, tmp_path: Path, media_type: str, data: bytes
) -> None:
    with pytest.raises(ArtifactInputError) as err:
        await store.save("f.bin", data, media_type=media_type)
    assert err.value.field == "media_type"
    assert _blob_files(tmp_path / "artifacts") == []
    assert await store.list() == []


async def test_media_types_that_tell_the_truth_are_kept(store: ArtifactStore) -> None:
    for name, media_type, data in [
        ("i.png", "image/png", PNG),
        ("j.json", "application/json; charset=utf-8", b'{"a": 1}'),
        ("t.md", "text/markdown", "é # ok".encode()),
        ("o.bin", "application/octet-stream", PNG),
        ("v.json", "application/vnd.example+json", b"[]"),
    ]:
        record = await store.save(name, data, media_type=media_type)
        assert record.media_type == media_type


async def test_a_blob_over_the_limit_is_refused(tmp_path: Path) -> None:
    store = ArtifactStore.open(tmp_path / "a", ArtifactsConfig(max_bytes=10))
    with pytest.raises(ArtifactTooLargeError) as err:
        await store.save("big.bin", b"x" * 11, media_type="application/octet-stream")
    assert str(err.value) == "data: 11 bytes is over the limit of 10 bytes"
    assert _blob_files(tmp_path / "a") == []
    assert await store.list() == []


@pytest.mark.parametrize(
    ("scope", "scope_id", "field"),
    [
        ("session", "x", "scope"),
        ("plan", "", "scope_id"),
        ("deployment", "x", "scope_id"),
        ("plan", "../x", "scope_id"),
    ],
)
async def test_bad_scopes_are_refused(
    store: ArtifactStore, scope: str, scope_id: str, field: str
) -> None:
    with pytest.raises(ArtifactInputError) as err:
        await store.save("n.txt", b"x", media_type="text/plain", scope=scope, scope_id=scope_id)
    assert err.value.field == field


async def test_unknown_artifacts_and_versions_are_named(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFoundError, match=r"no artifact plan/p/nope\.txt"):
        await store.load("nope.txt", scope="plan", scope_id="p")
    await store.save("n.txt", b"x", media_type="text/plain")
    with pytest.raises(ArtifactNotFoundError, match=r"deployment//n.txt@7"):
        await store.load("n.txt", version=7)
    with pytest.raises(ArtifactInputError, match="version"):
        await store.load("n.txt", version=0)


async def test_retention_by_count_and_age_per_scope_then_the_sweep(tmp_path: Path) -> None:
    # the store's clock runs ahead of the files' times (the sweep compares them)
    now = [time.time()]
    config = ArtifactsConfig(
        sweep_grace_s=0,
        index_bytes=0,
        retention={
            "plan": ArtifactRetention(max_versions=2),
            "agent": ArtifactRetention(max_age_s=100),
        },
    )
    root = tmp_path / "a"
    store = ArtifactStore(
        FileBlobStore(root / "blobs"),
        SqliteArtifactIndex(root / "i.sqlite3"),
        config,
        clock=lambda: now[0],
    )
    for i in range(4):
        await store.save(
            "v.txt", f"{i}".encode(), media_type="text/plain", scope="plan", scope_id="p"
        )
        await store.save(
            "w.txt", f"w{i}".encode(), media_type="text/plain", scope="agent", scope_id="tactical"
        )
        await store.save("d.txt", f"d{i}".encode(), media_type="text/plain")
        now[0] += 60
    removed = await store.prune()
    # plan: the newest two of four kept; agent: saved at T, T+60, T+120, T+180, pruned at T+240:
    # all but the newest are older than 100 s, and the newest is kept.
    assert sorted((r.scope, r.version) for r in removed) == [
        ("agent", 1),
        ("agent", 2),
        ("agent", 3),
        ("plan", 1),
        ("plan", 2),
    ]
    assert len(await store.list(scope="deployment")) == 4  # no rule: kept
    swept = await store.sweep()
    assert len(swept.blobs) == 5
    assert len(_blob_files(root)) == 7
    for record in await store.list():
        await store.load(
            record.name, scope=record.scope, scope_id=record.scope_id, version=record.version
        )


async def test_the_sweep_spares_young_blobs(tmp_path: Path) -> None:
    store = ArtifactStore.open(tmp_path / "a", ArtifactsConfig(sweep_grace_s=3600))
    store.blobs.put("0" * 64, b"orphan in the making")
    assert (await store.sweep()).blobs == ()
    assert (await store.sweep(grace_s=0)).blobs == ("0" * 64,)


def test_a_ref_round_trips_and_only_the_exact_form_is_one() -> None:
    record = ArtifactRecord("n", 3, "text/plain", 4, "a" * 64, "goal", "g1", 1.0)
    value = json.loads(json.dumps(record.ref.to_json()))
    assert ArtifactRef.from_json(value) == record.ref
    assert record.key == "goal/g1/n@3"
    assert ArtifactRef.from_json({"$artifact": {"scope": "nope"}}) is None
    assert ArtifactRef.from_json({"$artifact": record.ref.to_json()["$artifact"], "x": 1}) is None


_FULL_DISK = textwrap.dedent(
    """
    import asyncio, resource, signal, sys
    from stratagem.planning import ArtifactsConfig, ArtifactStore, ArtifactStorageError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = ArtifactStore.open(sys.argv[1], ArtifactsConfig(index_bytes=0))
    store.save_blocking("warm.txt", b"warm", media_type="text/plain")
    # no file may grow past 64 KiB from here on: a write past it fails as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
    try:
        store.save_blocking("big.bin", b"x" * 200_000, media_type="application/octet-stream")
    except ArtifactStorageError as exc:
        print("REFUSED", exc)
    """
)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "a"
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("REFUSED no space left to write a blob of 200000 bytes"), line
    assert "\n" not in line
    assert "nothing was saved" in line
    assert os.listdir(root / "blobs" / "tmp") == []
    assert len(_blob_files(root)) == 1
    store = ArtifactStore.open(root)
    assert [r.name for r in store.index.list()] == ["warm.txt"]
    assert isinstance(ArtifactStorageError("x", "y"), Exception)


# --- the index on each database ---------------------------------------------------------------


def _record(name: str, digest: str, *, plan_id: str = "", step_id: str = "") -> ArtifactRecord:
    return ArtifactRecord(
        name,
        0,
        "text/plain",
        1,
        digest,
        "plan",
        "p",
        1.0,
        ArtifactProvenance(agent="tactical", plan_id=plan_id, step_id=step_id),
    )


def _exercise_index(index: ArtifactIndex) -> None:
    one, added = index.add(_record("n", "a" * 64, plan_id="p", step_id="s"))
    assert (one.version, added) == (1, True)
    two, added = index.add(_record("n", "b" * 64))
    assert (two.version, added) == (2, True)
    assert index.add(_record("n", "b" * 64)) == (two, False)  # the newest holds these bytes
    assert index.add(_record("n", "a" * 64, plan_id="p", step_id="s")) == (one, False)
    three, added = index.add(_record("n", "a" * 64))  # same bytes, another writer: new version
    assert (three.version, added) == (3, True)
    assert index.get("plan", "p", "n", None) == three
    assert index.get("plan", "p", "n", 2) == two
    assert index.get("plan", "p", "n", 9) is None
    assert [r.version for r in index.list(scope="plan", scope_id="p", name="n")] == [1, 2, 3]
    assert index.list(latest=True) == [three]
    assert [r.version for r in index.with_digest("a" * 64)] == [1, 3]
    assert index.digests() == {"a" * 64, "b" * 64}
    assert index.remove([one, two]) == 2
    assert index.digests() == {"a" * 64}
    assert index.list()[0].provenance == ArtifactProvenance(agent="tactical")


def _versions_in_parallel(make: Callable[[], ArtifactIndex]) -> list[int]:
    """Eight threads, each its own connection, saving different bytes under one name."""
    indexes = [make() for _ in range(8)]

    def save(i: int) -> int:
        return indexes[i].add(_record("race", f"{i:064x}"))[0].version

    with ThreadPoolExecutor(8) as pool:
        versions = sorted(pool.map(save, range(8)))
    for index in indexes:
        index.close()
    return versions


def test_sqlite_index(tmp_path: Path) -> None:
    index = SqliteArtifactIndex(tmp_path / "i.sqlite3")
    _exercise_index(index)
    index.close()
    assert _versions_in_parallel(lambda: SqliteArtifactIndex(tmp_path / "r.sqlite3")) == list(
        range(1, 9)
    )


def test_in_memory_index() -> None:
    _exercise_index(InMemoryArtifactIndex())


@pytest.mark.postgres
def test_postgres_index(postgres_url: str) -> None:
    from stratagem.planning import PostgresArtifactIndex

    index = PostgresArtifactIndex(postgres_url)
    _exercise_index(index)
    index.close()
    assert _versions_in_parallel(lambda: PostgresArtifactIndex(postgres_url)) == list(range(1, 9))
    reopened = PostgresArtifactIndex(postgres_url)
    assert [r.name for r in reopened.list()] == ["n"] + ["race"] * 8
    reopened.close()


@pytest.mark.postgres
async def test_a_store_on_postgres_round_trips(postgres_url: str, tmp_path: Path) -> None:
    from stratagem.planning import PostgresArtifactIndex

    store = ArtifactStore(FileBlobStore(tmp_path / "b"), PostgresArtifactIndex(postgres_url))
    saved = await store.save("r.json", b"{}", media_type="application/json")
    assert await store.load("r.json") == (saved, b"{}")
    await store.aclose()


# --- small artifacts: bytes kept with their record ----------------------------------------------


def _kept_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> ArtifactStore:
    blobs = FileBlobStore(tmp_path / "artifacts" / "blobs")
    if kind == "sqlite":
        return ArtifactStore(blobs, SqliteArtifactIndex(tmp_path / "artifacts" / "index.sqlite3"))
    if kind == "memory":
        return ArtifactStore(blobs, InMemoryArtifactIndex())
    from stratagem.planning import PostgresArtifactIndex

    return ArtifactStore(blobs, PostgresArtifactIndex(request.getfixturevalue("postgres_url")))


@pytest.fixture(params=["sqlite", "memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def kept_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ArtifactStore]:
    store = _kept_store(str(request.param), tmp_path, request)
    yield store
    await store.aclose()


async def test_a_small_artifact_is_kept_with_its_record_not_as_a_file(
    kept_store: ArtifactStore, tmp_path: Path
) -> None:
    limit = kept_store.config.index_bytes
    small = await kept_store.save("small.txt", b"s" * limit, media_type="text/plain")
    again = await kept_store.save("again.txt", b"s" * limit, media_type="text/plain")
    assert _blob_files(tmp_path / "artifacts") == []
    assert kept_store.index.kept(small.digest) == b"s" * limit
    assert again.digest == small.digest
    assert await kept_store.load("small.txt") == (small, b"s" * limit)
    ref = ArtifactRef(
        small.scope, small.scope_id, small.name, 1, small.digest, small.size, small.media_type
    )
    assert await kept_store.load_ref(ref) == b"s" * limit
    target = tmp_path / "out.txt"
    assert await kept_store.load_file("small.txt", target) == small
    assert target.read_bytes() == b"s" * limit
    assert kept_store.bytes_blocking(small.digest) == b"s" * limit

    # One byte over the limit: a blob file, and nothing kept by the index.
    large = await kept_store.save("large.txt", b"l" * (limit + 1), media_type="text/plain")
    assert [p.name for p in _blob_files(tmp_path / "artifacts")] == [large.digest]
    assert kept_store.index.kept(large.digest) is None
    assert (await kept_store.load("large.txt"))[1] == b"l" * (limit + 1)


async def test_kept_bytes_go_with_the_last_record_naming_them(kept_store: ArtifactStore) -> None:
    one = await kept_store.save("one.txt", b"shared", media_type="text/plain")
    two = await kept_store.save("two.txt", b"shared", media_type="text/plain")
    own = await kept_store.save("own.txt", b"own", media_type="text/plain")
    assert kept_store.index.remove([one, own]) == 2
    assert kept_store.index.kept(two.digest) == b"shared"  # two.txt still names them
    assert kept_store.index.kept(own.digest) is None
    assert (await kept_store.load("two.txt"))[1] == b"shared"
    assert kept_store.index.remove([two]) == 1
    assert kept_store.index.kept(two.digest) is None


def test_a_killed_small_save_leaves_neither_record_nor_bytes(tmp_path: Path) -> None:
    # The record and its bytes are one transaction: a save killed before it commits leaves
    # nothing (and nothing for the sweep to find), one after it leaves both.
    root = tmp_path / "artifacts"
    script = textwrap.dedent(
        """
        import os, sys
        from stratagem.planning import ArtifactStore
        store = ArtifactStore.open(sys.argv[1])
        store.save_blocking("first.txt", b"first", media_type="text/plain")
        def dying(statement):
            if statement.startswith("INSERT OR IGNORE INTO artifact_bytes"):
                os.kill(os.getpid(), 9)  # the record's row written, the commit not
        store.index._connection().set_trace_callback(dying)
        store.save_blocking("second.txt", b"second", media_type="text/plain")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == -9, done.stderr
    store = ArtifactStore.open(root)
    assert [r.name for r in store.list_blocking()] == ["first.txt"]
    assert store.index.kept(hashlib.sha256(b"second").hexdigest()) is None
    assert store.index.kept(hashlib.sha256(b"first").hexdigest()) == b"first"
    assert _blob_files(root) == []
    assert store.sweep_blocking(grace_s=0).blobs == ()
    store.index.close()


async def test_artifacts_saved_as_files_still_load_once_small_ones_are_kept(
    tmp_path: Path,
) -> None:
    old = ArtifactStore.open(tmp_path / "artifacts", FILES)
    saved = await old.save("old.txt", b"from before", media_type="text/plain")
    await old.aclose()
    now = ArtifactStore.open(tmp_path / "artifacts")
    assert saved.size <= now.config.index_bytes
    assert await now.load("old.txt") == (saved, b"from before")
    target = tmp_path / "old.txt"
    await now.load_file("old.txt", target)
    assert target.read_bytes() == b"from before"
    await now.aclose()


async def test_corrupted_kept_bytes_are_named_and_never_reach_a_target(tmp_path: Path) -> None:
    store = ArtifactStore.open(tmp_path / "artifacts")
    record = await store.save("k.txt", b"kept bytes", media_type="text/plain")
    await store.aclose()
    rot_artifact(tmp_path / "artifacts", record.digest)
    with pytest.raises(ArtifactCorruptError, match=record.digest) as caught:
        await store.load("k.txt")
    assert "index.sqlite3 (kept with its record)" in str(caught.value)
    assert "\n" not in str(caught.value)
    target = tmp_path / "out.txt"
    target.write_bytes(b"untouched")
    with pytest.raises(ArtifactCorruptError):
        await store.load_file("k.txt", target)
    assert target.read_bytes() == b"untouched"
    assert sorted(os.listdir(tmp_path)) == ["artifacts", "out.txt"]
    await store.aclose()


@pytest.mark.parametrize("value", [-1, ARTIFACT_INDEX_BYTES_MAX + 1])
def test_index_bytes_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="index_bytes: must be between 0 and 262144"):
        ArtifactsConfig(index_bytes=value)


# --- files, copied in the kernel ----------------------------------------------------------------


async def test_a_file_saved_and_loaded_as_a_file(store: ArtifactStore, tmp_path: Path) -> None:
    source = tmp_path / "chart.png"
    source.write_bytes(PNG + os.urandom(100_000))
    record = await store.save_file("chart.png", source, media_type="image/png")
    assert record.digest == hashlib.sha256(source.read_bytes()).hexdigest()
    assert record.size == source.stat().st_size
    again = await store.save_file("chart.png", source, media_type="image/png")
    assert again == record  # idempotent by digest
    assert len(_blob_files(tmp_path / "artifacts")) == 1
    target = tmp_path / "out" / "copy.png"
    target.parent.mkdir()
    assert await store.load_file("chart.png", target) == record
    assert target.read_bytes() == source.read_bytes()
    assert os.listdir(tmp_path / "artifacts" / "blobs" / "tmp") == []
    text = tmp_path / "notes.json"
    text.write_bytes(b'{"a": 1}')
    assert (await store.save_file("notes.json", text, media_type="application/json")).size == 8


async def test_a_file_that_lies_or_is_missing_is_refused(
    store: ArtifactStore, tmp_path: Path
) -> None:
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"GIF89a" + b"\x00" * 1000)
    with pytest.raises(ArtifactInputError, match="media_type: 'image/png' does not fit"):
        await store.save_file("fake.png", fake, media_type="image/png")
    with pytest.raises(ArtifactInputError, match="source: cannot read"):
        await store.save_file("none.bin", tmp_path / "none", media_type="image/png")
    big = ArtifactStore.open(tmp_path / "small", ArtifactsConfig(max_bytes=100))
    with pytest.raises(ArtifactTooLargeError):
        await big.save_file("fake.gif", fake, media_type="image/gif")
    assert _blob_files(tmp_path / "artifacts") == []
    assert await store.list() == []


async def test_a_corrupted_blob_never_reaches_the_target_file(
    store: ArtifactStore, tmp_path: Path
) -> None:
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(5000))
    record = await store.save_file("data.bin", source, media_type="application/octet-stream")
    [blob] = _blob_files(tmp_path / "artifacts")
    blob.write_bytes(b"rot" + blob.read_bytes()[3:])
    target = tmp_path / "out.bin"
    with pytest.raises(ArtifactCorruptError, match=record.digest):
        await store.load_file("data.bin", target)
    assert not target.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".out.bin")] == []


def _bytes_read() -> int:
    """What this process has read so far, as the kernel counts it (``read``, ``sendfile`` and
    ``copy_file_range`` alike, page cache or not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_file_is_read_once_to_save_it_and_once_to_load_it(
    store: ArtifactStore, tmp_path: Path
) -> None:
    # The digest is taken while the bytes are copied: one pass over the source to save, one
    # over the blob to load (not a copy then a second read of the copy to hash it).
    size = 8 << 20
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(size))
    before = _bytes_read()
    record = store.save_file_blocking("big.bin", source, media_type="application/octet-stream")
    saved = _bytes_read() - before
    assert record.digest == hashlib.sha256(source.read_bytes()).hexdigest()
    assert size <= saved < 1.5 * size, saved
    target = tmp_path / "out.bin"
    before = _bytes_read()
    store.load_file_blocking("big.bin", target)
    loaded = _bytes_read() - before
    assert target.read_bytes() == source.read_bytes()
    assert size <= loaded < 1.5 * size, loaded


async def test_a_small_save_on_a_local_store_skips_the_thread_hop(tmp_path: Path) -> None:
    # Handing a 1 KiB save to a thread and back cost about as much as the rest of its step:
    # on a local store it runs on the caller's thread; a large one, or any on a store not
    # declared local (S3, PostgreSQL), still runs on a worker thread.
    threads: list[int] = []

    def watched(store: ArtifactStore) -> ArtifactStore:
        add = store.index.add

        def recording(
            record: ArtifactRecord, data: bytes | None = None
        ) -> tuple[ArtifactRecord, bool]:
            threads.append(threading.get_ident())
            return add(record, data)

        store.index.add = recording  # type: ignore[method-assign]
        return store

    here = threading.get_ident()
    local = watched(ArtifactStore.open(tmp_path / "local"))
    small = await local.save("small.txt", b"x" * 1024, media_type="text/plain")
    large = await local.save("large.bin", os.urandom(200_000), media_type="image/x-raw")
    remote = watched(
        ArtifactStore(FileBlobStore(tmp_path / "b"), SqliteArtifactIndex(tmp_path / "i.sqlite3"))
    )
    await remote.save("small.txt", b"x" * 1024, media_type="text/plain")
    assert [t == here for t in threads] == [True, False, False]
    off = watched(ArtifactStore.open(tmp_path / "off", ArtifactsConfig(on_loop_bytes=0)))
    await off.save("small.txt", b"x" * 1024, media_type="text/plain")
    assert [t == here for t in threads] == [True, False, False, False]
    assert (await local.load("small.txt"))[1] == b"x" * 1024
    assert (small.version, large.size) == (1, 200_000)
    with pytest.raises(ValueError, match="on_loop_bytes: must be >= 0"):
        ArtifactsConfig(on_loop_bytes=-1)


def test_the_json_forms_name_every_field() -> None:
    # ``to_json`` spells its fields out (``dataclasses.asdict`` was a measurable part of a small
    # save): a field added to the dataclass and not to its JSON would be lost in the index.
    prov = ArtifactProvenance("a", "p", 2, "s", 3, ("d" * 64,), "t", "1", 5.0)
    assert prov.to_json() == {**dataclasses.asdict(prov), "inputs": ["d" * 64]}
    assert ArtifactProvenance.from_json(prov.to_json()) == prov
    ref = ArtifactRef("plan", "p", "n", 1, "d" * 64, 3, "text/plain")
    assert ref.to_json() == {"$artifact": dataclasses.asdict(ref)}
    assert ArtifactRef.from_json(ref.to_json()) == ref


def test_a_save_decodes_only_the_versions_it_can_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A save looks for a version it repeats (same bytes from the same step, or the newest):
    # it reads those rows, not every version of the name, so the thousandth save of a name costs
    # what the first did.
    from stratagem.planning._artifacts import _sqlite

    index = SqliteArtifactIndex(tmp_path / "i.sqlite3")
    for i in range(50):
        index.add(_record("n", f"{i:064x}", plan_id="p", step_id=f"s{i}"))
    decoded: list[tuple[object, ...]] = []
    real = _sqlite.record_of

    def counting(row: tuple[object, ...]) -> ArtifactRecord:
        decoded.append(row)
        return real(row)

    monkeypatch.setattr(_sqlite, "record_of", counting)
    new, added = index.add(_record("n", "f" * 64))
    assert (new.version, added) == (51, True)
    assert len(decoded) == 1  # the newest only
    decoded.clear()
    again, added = index.add(_record("n", f"{7:064x}", plan_id="p", step_id="s7"))
    assert (again.version, added) == (8, False)  # the same step's bytes: its version
    assert len(decoded) == 2  # that version and the newest
    index.close()
