"""The deployment's artifact retention: ``STRATAGEM_ARTIFACTS_RETENTION`` read into the store's
rules, and the agents' housekeeping (prune, then sweep) at most once an hour."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stratagem.planning import (
    ArtifactRetention,
    ArtifactsConfig,
    ArtifactStore,
    FileBlobStore,
    SqliteArtifactIndex,
)
from stratagem.runtime import load_settings
from stratagem.runtime._cli import app
from stratagem.runtime.config._artifacts import open_artifact_store
from stratagem.runtime.host._artifacts import ArtifactHousekeeping


def test_the_setting_becomes_the_stores_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "STRATAGEM_ARTIFACTS_RETENTION",
        '{"plan": {"max_age_s": 60}, "agent": {"max_versions": 2, "keep_latest": false}}',
    )
    store = open_artifact_store(load_settings(state_dir=tmp_path))
    assert dict(store.config.retention) == {
        "plan": ArtifactRetention(max_age_s=60),
        "agent": ArtifactRetention(max_versions=2, keep_latest=False),
    }


@pytest.mark.parametrize(
    ("value", "words"),
    [('{"galaxy": {}}', "artifacts_retention"), ('{"plan": {"max_versions": 0}}', "max_versions")],
)
def test_a_bad_retention_setting_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, words: str
) -> None:
    monkeypatch.setenv("STRATAGEM_ARTIFACTS_RETENTION", value)
    result = CliRunner().invoke(app, ["artifacts", "list", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr


async def test_housekeeping_prunes_then_sweeps_at_most_once_an_hour(tmp_path: Path) -> None:
    now = [1000.0]
    store = ArtifactStore(
        FileBlobStore(tmp_path / "blobs"),
        SqliteArtifactIndex(tmp_path / "index.sqlite3"),
        ArtifactsConfig(
            sweep_grace_s=0, index_bytes=0, retention={"plan": ArtifactRetention(max_versions=1)}
        ),
        clock=lambda: time.time() + 10,  # ahead of the files' times: the sweep may take them
    )
    for text in ("one", "two", "three"):
        await store.save(
            "r.txt", text.encode(), media_type="text/plain", scope="plan", scope_id="p"
        )
    housekeeping = ArtifactHousekeeping(store, every_s=3600, clock=lambda: now[0])
    assert await housekeeping.maybe_run()
    assert [r.version for r in await store.list(scope="plan", scope_id="p")] == [3]
    assert len(list(store.blobs.blobs())) == 1  # the two pruned versions' blobs swept
    await store.save("r.txt", b"four", media_type="text/plain", scope="plan", scope_id="p")
    now[0] += 60
    assert not await housekeeping.maybe_run()  # not due: nothing removed
    assert len(await store.list(scope="plan", scope_id="p")) == 2
    now[0] += 3600
    assert await housekeeping.maybe_run()
    assert [r.version for r in await store.list(scope="plan", scope_id="p")] == [4]
