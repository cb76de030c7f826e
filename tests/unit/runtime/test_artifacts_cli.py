"""``stratagem artifacts list | show | get | provenance`` and ``ArtifactsClient`` over a state
directory's artifact store (real files, real SQLite)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stratagem.planning import ArtifactProvenance, ArtifactStore
from stratagem.runtime import ArtifactReadError, ArtifactsClient, InputError, load_settings
from stratagem.runtime._cli import app
from tests.docs_blocks import DOCS, blocks, console_commands
from tests.unit.planning._support import rot_artifact

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    store = ArtifactStore.open(folder / "artifacts")
    source = store.save_blocking("source.txt", b"facts", media_type="text/plain")
    store.save_blocking(
        "report.md",
        b"# one",
        media_type="text/markdown",
        scope="plan",
        scope_id="report-1",
        provenance=ArtifactProvenance(
            agent="tactical",
            plan_id="report-1",
            revision=1,
            step_id="write",
            attempt=2,
            inputs=(source.digest,),
            tool="artifact.save",
            tool_version="0.1",
        ),
    )
    store.save_blocking(
        "report.md", b"# two", media_type="text/markdown", scope="plan", scope_id="report-1"
    )
    store.save_blocking("chart.png", PNG, media_type="image/png")
    store.index.close()
    return folder


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_list_json_is_one_object_per_artifact(state_dir: Path) -> None:
    code, out, _ = _run("artifacts", "list", "--state-dir", str(state_dir), "--json")
    assert code == 0
    listed = json.loads(out)
    assert [(a["name"], a["version"]) for a in listed] == [
        ("chart.png", 1),
        ("source.txt", 1),
        ("report.md", 2),
    ]
    for item in listed:
        assert {"name", "version", "digest", "size"} <= set(item)
    code, out, _ = _run(
        "artifacts", "list", "--state-dir", str(state_dir), "--plan", "report-1", "--all", "--json"
    )
    assert [a["version"] for a in json.loads(out)] == [1, 2]


def test_list_show_and_provenance_as_tables(state_dir: Path) -> None:
    code, out, _ = _run("artifacts", "list", "--state-dir", str(state_dir))
    assert code == 0
    assert "report.md" in out
    assert "chart.png" in out
    code, out, _ = _run(
        "artifacts",
        "show",
        "report.md",
        "--plan",
        "report-1",
        "--version",
        "1",
        "--state-dir",
        str(state_dir),
    )
    assert code == 0
    assert "text/markdown" in out
    code, out, err = _run(
        "artifacts",
        "provenance",
        "report.md",
        "--plan",
        "report-1",
        "--version",
        "1",
        "--state-dir",
        str(state_dir),
    )
    assert code == 0
    flat = " ".join(out.split())
    assert "tactical" in flat
    assert "write attempt 2" in flat
    assert "deployment//source.txt@1" in flat
    assert "stratagem plans show report-1" in err


def test_provenance_json_links_the_inputs(state_dir: Path) -> None:
    code, out, _ = _run(
        "artifacts",
        "provenance",
        "report.md",
        "--plan",
        "report-1",
        "--version",
        "1",
        "--state-dir",
        str(state_dir),
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["artifact"]["provenance"]["step_id"] == "write"
    assert [i["name"] for i in data["inputs"]] == ["source.txt"]


def test_get_writes_the_bytes(state_dir: Path, tmp_path: Path) -> None:
    code, out, _ = _run(
        "artifacts", "get", "report.md", "--plan", "report-1", "--state-dir", str(state_dir)
    )
    assert code == 0
    assert out == "# two"
    target = tmp_path / "chart.png"
    code, _, err = _run(
        "artifacts", "get", "chart.png", "-o", str(target), "--state-dir", str(state_dir)
    )
    assert code == 0
    assert target.read_bytes() == PNG
    assert "wrote deployment//chart.png@1" in err


def test_a_corrupted_blob_is_one_line_exit_1_and_not_served(state_dir: Path) -> None:
    client = ArtifactsClient(load_settings(state_dir=state_dir))
    record = client.show_blocking("chart.png")
    rot_artifact(state_dir / "artifacts", record.digest, b"rotten")
    code, out, err = _run("artifacts", "get", "chart.png", "--state-dir", str(state_dir))
    assert code == 1
    assert out == ""
    assert err.strip().count("\n") == 0
    assert record.digest in err
    assert "corrupted" in err
    with pytest.raises(ArtifactReadError):
        client.get_blocking("chart.png")
    client.close()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("show", "nope.txt"), "no artifact deployment//nope.txt"),
        (("show", "../etc"), "name: "),
        (("get", "report.md", "--plan", "report-1", "--version", "9"), "@9"),
        (("list", "--scope", "galaxy"), "scope: 'galaxy'"),
        (("show", "x", "--plan", "p", "--scope", "agent"), "--plan"),
    ],
)
def test_bad_input_is_one_line_exit_2(state_dir: Path, args: tuple[str, ...], words: str) -> None:
    code, _out, err = _run("artifacts", *args, "--state-dir", str(state_dir))
    assert code == 2
    assert words in err
    assert err.strip().count("\n") == 0
    assert "Traceback" not in err


async def test_the_python_client_async_and_blocking(state_dir: Path) -> None:
    client = ArtifactsClient(load_settings(state_dir=state_dir))
    records = await client.list(scope="plan", scope_id="report-1", all_versions=True)
    assert [r.version for r in records] == [1, 2]
    _record, data = await client.get("report.md", scope="plan", scope_id="report-1", version=1)
    assert data == b"# one"
    lineage = await client.provenance("report.md", scope="plan", scope_id="report-1", version=1)
    assert lineage.inputs[0].name == "source.txt"
    assert (await client.show("source.txt")).size == 5
    with pytest.raises(InputError, match="no artifact"):
        await client.show("missing.txt")
    client.close()


def test_the_commands_of_artifacts_memory_md_run(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [block] = [
        b
        for b in blocks(DOCS / "artifacts-memory.md")
        if b.language == "console" and "stratagem artifacts" in b.text
    ]
    monkeypatch.chdir(tmp_path)
    commands = console_commands(block.text).splitlines()
    assert len(commands) == 5
    for command in commands:
        words = shlex.split(command)
        assert words[:2] == ["stratagem", "artifacts"]
        code, _, err = _run(*words[1:], "--state-dir", str(state_dir))
        assert code == 0, (command, err)
    assert (tmp_path / "report.md").read_bytes() == b"# two"


@pytest.mark.parametrize(
    ("url", "credentials", "words"),
    [
        ("ftp://host/bucket", "a\nb\n", "is not http(s)://HOST[:PORT]/BUCKET"),
        ("http://127.0.0.1:9", "a\nb\n", "is not http(s)://HOST[:PORT]/BUCKET"),
        ("http://127.0.0.1:9/bucket", None, "needed with STRATAGEM_ARTIFACTS_S3_URL"),
        ("http://127.0.0.1:9/bucket", "only-one-line\n", "must hold two lines"),
    ],
)
def test_a_bad_s3_setting_is_one_line_exit_2(
    tmp_path: Path, url: str, credentials: str | None, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATAGEM_ARTIFACTS_S3_URL", url)
    if credentials is not None:
        path = tmp_path / "s3.credentials"
        path.write_text(credentials)
        monkeypatch.setenv("STRATAGEM_ARTIFACTS_S3_CREDENTIALS_FILE", str(path))
    code, _, err = _run("artifacts", "list", "--state-dir", str(tmp_path / "state"))
    assert code == 2
    assert words in err
    assert err.strip().count("\n") == 0
