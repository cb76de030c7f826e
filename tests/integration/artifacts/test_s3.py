"""The artifact store on an S3-compatible object store: a real server (s3rver, installed by
``scripts/s3_server.sh``) on 127.0.0.1, reached over HTTP with SigV4-signed requests; the records
in SQLite. Not a mock library: the server stores the objects in its own folder and checks each
request is signed (s3rver parses the signature; unlike AWS S3 it neither rejects a wrong secret
nor checks the payload hash, so those are not tested here)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.planning import (
    ArtifactCorruptError,
    ArtifactsConfig,
    ArtifactStorageError,
    ArtifactStore,
    S3BlobStore,
    SqliteArtifactIndex,
)
from stratagem.runtime import ArtifactsClient, load_settings
from stratagem.runtime.config._artifacts import open_artifact_store

REPO = Path(__file__).resolve().parents[3]
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _unavailable(reason: str) -> None:
    message = f"no S3-compatible server: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    installed = subprocess.run(
        ["bash", str(REPO / "scripts" / "s3_server.sh"), "install"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if installed.returncode != 0:
        _unavailable(installed.stderr.strip()[-300:])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp_path_factory.mktemp("s3rver")
    server = subprocess.Popen(
        [
            "node",
            installed.stdout.strip(),
            "-d",
            str(folder),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    _unavailable(f"s3rver did not start: {server.stderr.read()[-300:]!r}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


def _blobs(endpoint: str, bucket: str, **more: str) -> S3BlobStore:
    return S3BlobStore(endpoint, bucket, access_key="S3RVER", secret_key="S3RVER", **more)


def test_save_load_dedupe_list_and_sweep_on_a_real_server(s3_endpoint: str, tmp_path: Path) -> None:
    blobs = _blobs(s3_endpoint, "artifacts-a")
    store = ArtifactStore(
        blobs,
        SqliteArtifactIndex(tmp_path / "index.sqlite3"),
        ArtifactsConfig(sweep_grace_s=0, index_bytes=0),  # every artifact in the bucket
    )
    one = store.save_blocking("a.png", PNG, media_type="image/png")
    two = store.save_blocking("b.png", PNG, media_type="image/png")
    assert one.digest == two.digest
    assert [digest for digest, _ in blobs.blobs()] == [one.digest]  # stored once
    assert store.load_blocking("a.png") == (one, PNG)
    target = tmp_path / "out.png"
    store.load_file_blocking("b.png", target)
    assert target.read_bytes() == PNG
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(3 << 20))
    big = store.save_file_blocking("big.bin", source, media_type="application/octet-stream")
    assert store.load_blocking("big.bin")[1] == source.read_bytes()
    # an orphan (a save killed between its blob and its record) goes at the sweep
    blobs.put("f" * 64, b"orphan")
    swept = store.sweep_blocking()
    assert swept.blobs == ("f" * 64,)
    assert sorted(d for d, _ in blobs.blobs()) == sorted({one.digest, big.digest})
    # the records survive a reopen; the bucket is the same
    store.index.close()
    again = ArtifactStore(
        _blobs(s3_endpoint, "artifacts-a"), SqliteArtifactIndex(tmp_path / "index.sqlite3")
    )
    assert again.load_blocking("a.png")[1] == PNG


def test_an_object_changed_in_the_bucket_is_named_never_served(
    s3_endpoint: str, tmp_path: Path
) -> None:
    blobs = _blobs(s3_endpoint, "artifacts-b")
    store = ArtifactStore(
        blobs, SqliteArtifactIndex(tmp_path / "index.sqlite3"), ArtifactsConfig(index_bytes=0)
    )
    record = store.save_blocking("n.txt", b"the truth", media_type="text/plain")
    blobs.corrupt_for_tests(record.digest, b"a lie")
    with pytest.raises(ArtifactCorruptError, match="corrupted") as err:
        store.load_blocking("n.txt")
    assert record.digest in str(err.value)
    blobs.delete(record.digest)
    with pytest.raises(ArtifactCorruptError, match="missing"):
        store.load_blocking("n.txt")


def test_an_unreachable_server_is_one_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    blobs = S3BlobStore(
        f"http://127.0.0.1:{port}", "x", access_key="a", secret_key="b", timeout_s=2
    )
    with pytest.raises(ArtifactStorageError, match="cannot find the bucket") as err:
        blobs.has("a" * 64)
    assert "\n" not in str(err.value)


def test_a_deployment_keeps_its_blobs_in_the_bucket_its_settings_name(
    s3_endpoint: str, tmp_path: Path
) -> None:
    credentials = tmp_path / "s3.credentials"
    credentials.write_text("S3RVER\nS3RVER\n")
    credentials.chmod(0o600)
    settings = load_settings(
        state_dir=tmp_path / "state",
        artifacts_s3_url=f"{s3_endpoint}/deployment/team-a",
        artifacts_s3_credentials_file=credentials,
    )
    store = open_artifact_store(settings)
    assert isinstance(store.blobs, S3BlobStore)
    text = b"# from S3\n" + b"-" * store.config.index_bytes  # over what the index keeps
    record = store.save_blocking("r.md", text, media_type="text/markdown")
    note = store.save_blocking("note.md", b"# kept by the index", media_type="text/markdown")
    assert not (tmp_path / "state" / "artifacts" / "blobs").exists()
    assert [d for d, _ in store.blobs.blobs()] == [record.digest]
    assert store.index.kept(note.digest) == b"# kept by the index"
    assert store.blobs.prefix == "team-a/sha256/"
    store.index.close()
    # what the CLI reads: the same bucket, the digest checked
    client = ArtifactsClient(settings)
    assert client.get_blocking("r.md")[1] == text
    assert client.get_blocking("note.md")[1] == b"# kept by the index"
    client.close()
