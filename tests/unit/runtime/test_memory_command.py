"""``stratagem memory put | get | list | search | delete`` and the Python client, on the
deployment's memory file: kept across runs, under the policy, audited, bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import stratagem.runtime._cli  # noqa: F401  # registers every command group
from stratagem.runtime._cli import _app as cli
from stratagem.runtime.config._settings import load_settings
from stratagem.runtime.operator._memory import MemoryAccessError, MemoryClient, SyncMemoryClient

runner = CliRunner()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STRATAGEM_POLICY_FILE", "STRATAGEM_STORE_URL", "STRATAGEM_EXTENSIONS"):
        monkeypatch.delenv(name, raising=False)


def _memory(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(cli.app, ["memory", *args, "--state-dir", str(tmp_path)])
    return result.exit_code, result.stdout, result.stderr


def test_put_get_list_search_delete_round_trip(tmp_path: Path) -> None:
    value = '{"fruit": "pears", "text": "pears and figs in the orchard", "n": 3}'
    code, out, err = _memory(
        tmp_path, "put", "--namespace", "user/ana", "--key", "likes", "--value", value
    )
    assert (code, err) == (0, "")
    assert "kept user/ana likes" in out
    _memory(tmp_path, "put", "-n", "user/bo", "-k", "likes", "-v", '{"fruit": "figs"}', "--json")
    code, out, _ = _memory(tmp_path, "get", "-n", "user/ana", "-k", "likes", "--json")
    assert code == 0
    assert json.loads(out)["value"]["n"] == 3
    code, out, _ = _memory(tmp_path, "search", "--namespace", "user", "orchard figs", "--json")
    found = json.loads(out)
    assert (found[0]["namespace"], found[0]["key"]) == ("user/ana", "likes")
    assert all(i["score"] is not None for i in found)
    code, out, _ = _memory(tmp_path, "search", "-n", "user", "--filter", "fruit=figs", "--json")
    assert [i["namespace"] for i in json.loads(out)] == ["user/bo"]
    code, out, _ = _memory(tmp_path, "search", "-n", "user", "--filter", "n=3", "--json")
    assert [i["namespace"] for i in json.loads(out)] == ["user/ana"]
    code, out, _ = _memory(tmp_path, "list", "-n", "user", "--json")
    assert [i["namespace"] for i in json.loads(out)] == ["user/ana", "user/bo"]
    code, out, _ = _memory(tmp_path, "delete", "-n", "user/bo", "-k", "likes", "--json")
    assert json.loads(out)["deleted"] is True
    code, _, err = _memory(tmp_path, "get", "-n", "user/bo", "-k", "likes")
    assert code == 1
    assert "no item 'likes'" in err
    # Every write is in the deployment's audit log; the chain verifies.
    result = runner.invoke(cli.app, ["audit", "verify", "--state-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["records"] == 3


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["put", "-n", "user/ana", "-k", "k", "-v", "{bad"], 2, "--value: not JSON"),
        (
            ["put", "-n", "user/ana", "-k", "k", "-v", "1", "--ttl", "0"],
            2,
            "--ttl: must be a positive number of seconds",
        ),
        (
            ["put", "-n", "user/ana", "-k", "k", "-v", "1", "--ttl", "-3"],
            2,
            "--ttl: must be a positive number of seconds",
        ),
        (["put", "-n", "user//ana", "-k", "k", "-v", "1"], 2, "namespace: part ''"),
        (["put", "-n", "user/ana", "-k", "", "-v", "1"], 2, "key: must have 1 to 512"),
        (
            ["put", "-n", "user/ana", "-k", "k", "-v", json.dumps("x" * 70_000)],
            2,
            "value: is 70002",
        ),
        (["search", "-n", "user", "--filter", "nope"], 2, "--filter: 'nope' is not FIELD=VALUE"),
        (["list", "-n", "user", "--limit", "0"], 2, "limit: must be an integer from 1 to 1000"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    got, out, err = _memory(tmp_path, *args)
    assert got == code
    assert len(err.strip().splitlines()) == 1
    assert message in err
    assert "Traceback" not in err
    _, out, _ = _memory(tmp_path, "list", "-n", "user", "--json")
    assert json.loads(out) == []


def test_a_namespace_the_policy_does_not_grant_is_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[memory]]\ncaller = "operator"\nnamespaces = ["user/*"]\naccess = ["read", "write"]\n'
    )
    settings = load_settings(state_dir=tmp_path / "state", policy_file=policy)
    with SyncMemoryClient(settings=settings) as memory:
        memory.put("user/ana", "k", 1)
        with pytest.raises(MemoryAccessError, match=r"may not write memory namespace 'agent/x'"):
            memory.put("agent/x", "k", 1)
        with pytest.raises(MemoryAccessError, match=r"may not read memory namespace 'agent'"):
            memory.list("agent")
        assert [item.key for item in memory.list("user/ana")] == ["k"]
        with pytest.raises(MemoryAccessError, match=r"may not read memory namespace 'user'"):
            memory.list("user")  # "user/*" covers each user, not the list of all of them


async def test_the_async_client_keeps_memory_across_clients(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    async with MemoryClient(settings=settings) as memory:
        await memory.put(("goal", "g-1"), "note", {"text": "the tower is locked"}, ttl_s=3600)
    async with MemoryClient(settings=settings) as memory:
        found = await memory.search("goal", "locked tower")
        assert [(item.namespace, item.key) for item in found] == [(("goal", "g-1"), "note")]


def test_the_console_block_of_artifacts_memory_md_runs_as_written(tmp_path: Path) -> None:
    """docs/artifacts-memory.md's command-line recipe, run command by command in a fresh state
    directory: each succeeds and prints the lines the page shows under it."""
    import shlex

    from tests.docs_blocks import DOCS, blocks

    (recipe,) = [
        b
        for b in blocks(DOCS / "artifacts-memory.md")
        if b.language == "console" and "stratagem memory" in b.text
    ]
    steps: list[tuple[list[str], list[str]]] = []
    for line in recipe.text.splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:]), []))
        elif line.strip():
            steps[-1][1].append(line)
    assert len(steps) == 7
    for argv, shown in steps:
        assert argv[0] == "stratagem"
        result = runner.invoke(cli.app, [*argv[1:], "--state-dir", str(tmp_path)])
        assert result.exit_code == 0, (argv, result.stderr)
        for expected in shown:
            assert expected in result.stdout, (argv, result.stdout)


async def test_the_sync_client_says_to_use_the_async_one_inside_a_loop(tmp_path: Path) -> None:
    memory = SyncMemoryClient(settings=load_settings(state_dir=tmp_path))
    with pytest.raises(RuntimeError, match="use MemoryClient"):
        memory.put("user/ana", "k", 1)
    async with MemoryClient(settings=load_settings(state_dir=tmp_path)) as client:
        assert await client.list("user") == []  # nothing was written
